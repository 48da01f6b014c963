#!/bin/bash
# The install with no registry, end to end (issue 59's acceptance; minutes, so not in the suite):
# a clean clone of HEAD, `make wheelhouse` in it (with the registry), a fresh venv, then with no
# network at all (`unshare -rn` where the kernel allows it, else PIP_NO_INDEX=1 and an
# unreachable proxy) `make install-offline VENV=<it>` and `locojax +experiment=arith_co
# run.steps=2`. Prints each step's seconds and the wheelhouse's size; exits at the first failure.
#   scripts/offline_check.sh [make wheelhouse variables, e.g. EXTRAS=test]   (SCRATCH=/tmp/x)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCRATCH=${SCRATCH:-$(mktemp -d /tmp/offline-check.XXXX)}
PY=${PY:-python3.11}
if unshare -rn true 2>/dev/null; then OFFLINE=(unshare -rn env); else
  OFFLINE=(env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9); fi
step() { local t=$SECONDS; "$@"; echo "offline_check: $((SECONDS - t)) s: $*" >&3; }
exec 3>&1

git clone -q --no-local "$ROOT" "$SCRATCH/clone"
git -C "$SCRATCH/clone" checkout -q "$(git -C "$ROOT" rev-parse HEAD)"
step make -C "$SCRATCH/clone" -s wheelhouse "$@"
du -sh "$SCRATCH/clone/wheelhouse"
step "$PY" -m venv "$SCRATCH/venv"
step "${OFFLINE[@]}" PIP_NO_INDEX=1 make -C "$SCRATCH/clone" -s install-offline \
  VENV="$SCRATCH/venv"
cd "$SCRATCH"
step "${OFFLINE[@]}" PIP_NO_INDEX=1 JAX_PLATFORMS=cpu "$SCRATCH/venv/bin/locojax" \
  +experiment=arith_co run.steps=2 hydra.run.dir="$SCRATCH/run" >"$SCRATCH/run.out" 2>&1 ||
  { tail -20 "$SCRATCH/run.out"; exit 1; }
grep "steps run" "$SCRATCH/run.out"
echo "offline_check: passed ($SCRATCH)"

#!/bin/bash
# Source on a TPU host after the lead's `.tpu-kit/setup.sh` (which installs LoCoJAX's wheels into
# /tmp/site and index packages into /tmp/site2): installs the wheels beside this file (made by
# benchmarks/tunix_kit.sh: google-tunix 0.1.7 and what its Sampler and GRPOLearner import) into
# $TUNIX_SITE3 (/tmp/site3) with no index and no dependencies, and pandas, pillow and sentencepiece
# from the host's own index (file:///opt/pypi/simple) into $TUNIX_SITE4 (/tmp/site4), each on its
# own (a name the index lacks is said and skipped; /tmp/site2 may already hold them: pandas comes
# with datasets, pillow with matplotlib), also with --no-deps, so no wheel brings a jax, jaxlib or
# numpy. Both folders go at the END of PYTHONPATH: the host's JAX stays first. Idempotent.
K=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
S3=${TUNIX_SITE3:-/tmp/site3}
S4=${TUNIX_SITE4:-/tmp/site4}
PIPI="python3 -m pip install --isolated -q --no-deps --no-compile --no-cache-dir"
if [ ! -f "$S3/.ok" ]; then
  PIP_CONFIG_FILE=/dev/null $PIPI --no-index --target "$S3" "$K"/*.whl && touch "$S3/.ok"
fi
if [ ! -f "$S4/.ok" ]; then
  for name in pandas pillow sentencepiece; do
    PIP_CONFIG_FILE=/dev/null $PIPI --only-binary=:all: --index-url file:///opt/pypi/simple \
      --target "$S4" --upgrade "$name" > "$S4.log" 2>&1 \
      || { tail -2 "$S4.log"; echo "tunix_setup: $name not installed from the host's index"; }
  done
  touch "$S4/.ok"
fi
case ":$PYTHONPATH:" in
  *":$S3:"*) ;;
  *) export PYTHONPATH=$PYTHONPATH:$S3:$S4 ;;
esac
export PYTHONUNBUFFERED=1

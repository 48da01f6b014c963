#!/bin/bash
# Run on a machine with the registry: fills DIR with the wheels that google-tunix 0.1.7's Sampler
# and GRPOLearner import (benchmarks/tunix_chip.py) beyond what a TPU host already has after the
# lead's TPU kit (.tpu-kit/setup.sh: JAX 0.10.2, flax 0.12.8, optax, orbax, absl, etils, ... from
# .tpu-kit/whl and the host's index), for Python 3.11 on x86-64 Linux; ~3.5 MB. Each pinned version
# was found by importing tunix in a venv with only those (the modules `import tunix` loads:
# metrax, clu, jaxtyping, wrapt, tqdm, huggingface_hub, perfetto, dateutil, PIL, pandas,
# sentencepiece) plus what its METADATA names for the paths it may take (grain, qwix, pylatexenc,
# python-dotenv, tenacity). --no-deps everywhere: no wheel brings a jax, jaxlib or numpy.
# pandas (12 MB), pillow (7 MB) and sentencepiece (2 MB) come from the host's own index instead
# (see tunix_setup.sh, copied into DIR). Then, from the checkout's root on the TPU host:
#   source .tpu-kit/setup.sh && source DIR/tunix_setup.sh
set -e
DIR=${1:?usage: benchmarks/tunix_kit.sh DIR}
mkdir -p "$DIR"
python3 -m pip download -q --isolated --no-deps --only-binary=:all: --python-version 3.11 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DIR" \
  google-tunix==0.1.7 google-metrax==0.2.4 clu==0.0.12 jaxtyping==0.3.11 wadler-lindig==0.1.8 \
  wrapt==2.5.2 tqdm==4.70.1 huggingface-hub==2.5.0 perfetto==0.59.1 python-dateutil==4.0.0 \
  six==1.17.0 tzdata==2026.6 pytz==2026.6 grain==0.2.18 qwix==0.1.8 pylatexenc==2.11 \
  python-dotenv==1.2.4 tenacity==9.2.1
cp "$(dirname "$0")/tunix_setup.sh" "$DIR/"
ls "$DIR"/*.whl | wc -l
du -sh "$DIR"

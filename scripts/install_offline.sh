#!/bin/sh
# Installs the project from wheelhouse/ with no index (`make install-offline`; docs/tpu.md):
# scripts/install_offline.py, run by $PYTHON (default python3: on a TPU image, the Python whose
# jax, jaxlib and libtpu are kept). Arguments: [--venv DIR | --target DIR] [--wheelhouse DIR].
exec "${PYTHON:-python3}" "$(dirname "$0")/install_offline.py" "$@"

"""Where the benchmarks find the peers' interpreter (HF transformers, tunix, TRL).

`make peers` creates `.venv-peers` in the repository from benchmarks/peers-requirements.txt.
LOCOJAX_PEERS_PYTHON points every peer at another interpreter; LOCOJAX_<NAME>_PYTHON (e.g.
LOCOJAX_TUNIX_PYTHON) one peer only.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS_VENV_PYTHON = REPO / ".venv-peers" / "bin" / "python"


def peer_python(name: str) -> Path:
    """The interpreter that runs peer `name`: its own override, the shared one, or .venv-peers."""
    for var in (f"LOCOJAX_{name.upper()}_PYTHON", "LOCOJAX_PEERS_PYTHON"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return PEERS_VENV_PYTHON

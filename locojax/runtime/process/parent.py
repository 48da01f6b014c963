"""A process that must not outlive the one that started it.

    parent pid --(PR_SET_PDEATHSIG, or a watching thread off Linux)--> SIGKILL to this process

Used by a supervised host (`launch.fatal`) and the TPU compiler's process (`aot.worker`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time


def die_with(parent: int) -> None:
    """This process is killed when `parent` (the process that started it) dies: the host
    when its supervisor dies (SIGKILL cannot be passed on), the TPU compiler's process when
    its `locojax-plan` does; at once when `parent` is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: watch the parent instead
        def orphaned() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=orphaned, daemon=True).start()
    if os.getppid() != parent:  # it died before prctl
        os.kill(os.getpid(), signal.SIGKILL)

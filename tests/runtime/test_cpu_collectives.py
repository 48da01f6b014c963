"""XLA:CPU's collectives among one process's devices wait as long as `with_device_count` says:
the flags it adds are ones XLA reads (a participant later than a 1-second limit the user set
aborts the process), and the user's own value wins over ours."""

import subprocess
import sys

from shared_runs import run_env

from locojax.runtime.process.job import CPU_COLLECTIVE_FLAGS, with_device_count

WARN = "--xla_cpu_collective_call_warn_stuck_timeout_seconds"
TERMINATE = "--xla_cpu_collective_call_terminate_timeout_seconds"
LATE = """
import time
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import io_callback

def late(i):
    if int(i) == 0:
        time.sleep(3)
    return np.float32(1)

def f(x):
    y = io_callback(late, jax.ShapeDtypeStruct((), jnp.float32), jax.lax.axis_index("i"))
    return jax.lax.psum(x * y, "i")

print(jax.pmap(f, axis_name="i")(jnp.ones(2)))
"""


def test_a_users_collective_limits_are_kept_and_read_by_xla():
    # XLA warns after the first limit, then aborts after the second more seconds.
    assert list(CPU_COLLECTIVE_FLAGS) == [WARN, TERMINATE]
    assert CPU_COLLECTIVE_FLAGS[TERMINATE] >= 600
    flags = with_device_count(f"{WARN}=1 {TERMINATE}=1", 2)
    assert flags.split()[:2] == [f"{WARN}=1", f"{TERMINATE}=1"] and len(flags.split()) == 3
    out = subprocess.run([sys.executable, "-c", LATE], capture_output=True, text=True,
                         timeout=120, env=run_env() | {"XLA_FLAGS": flags,
                                                       "JAX_PLATFORMS": "cpu"})
    assert out.returncode != 0 and "Termination timeout" in out.stderr, out.stderr[-2000:]

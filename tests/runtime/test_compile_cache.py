"""The persistent compilation cache the suite relies on (tests/conftest.py) hits across
processes on this machine: a program compiled by one `python` process is loaded, not compiled,
by the next (jax-ml/jax#38445 reports XLA:CPU entries rejected on some hosts; not this one's).
"""

import json
import os
import subprocess
import sys

from paths import ROOT

PROGRAM = """
import json, jax, jax.numpy as jnp
from jax._src import monitoring
events = []
monitoring.register_event_listener(lambda name, **_: events.append(name))
@jax.jit
def f(x):
    for _ in range(8):
        x = jnp.tanh(x @ x.T)
    return x
f(jnp.ones((32, 32))).block_until_ready()
print(json.dumps({k: sum(e.endswith(k) for e in events) for k in ("cache_hits", "cache_misses")}))
"""


def _counts(cache: str) -> dict[str, int]:
    # The settings conftest gives every test and subprocess, with a cache of this test's own.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    first = _counts(str(tmp_path / "cache"))
    assert first["cache_misses"] >= 1 and first["cache_hits"] == 0, first
    assert any((tmp_path / "cache").iterdir()), "nothing written to the cache"
    second = _counts(str(tmp_path / "cache"))
    assert second["cache_hits"] == first["cache_misses"] and second["cache_misses"] == 0, second


def test_the_suite_caches_every_program():
    """conftest's settings reach every subprocess: no compile is too quick or too small."""
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "-1"
    assert os.environ["JAX_COMPILATION_CACHE_DIR"]

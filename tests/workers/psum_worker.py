"""Test worker run by the local launcher: one cross-process sum; optionally one host dies.

Usage: python tests/workers/psum_worker.py [--die-host I] [--hang]
Prints `PSUM host=<i> pid=<pid> count=<n> devices=<d> total=<sum> gathered=<ids>` on stdout;
--hang then sleeps until killed.
With --die-host I, host I prints `DYING` and waits to be killed (the test sends SIGKILL once
every host's PSUM line came through the launcher) and the other hosts block in a second
collective until the distributed heartbeat aborts them.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from locojax.runtime.process.distributed import init_distributed, shutdown_distributed  # noqa: E402


def global_sum(mesh: Mesh) -> float:
    """Sum of arange(devices) laid out one element per device, across all processes."""
    n = mesh.devices.size
    values_N = np.arange(n, dtype=np.float32)
    array_N = jax.make_array_from_callback(
        (n,), NamedSharding(mesh, PartitionSpec("x")), lambda idx: values_N[idx])
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(array_N)
    return float(total)  # replicated: every process holds the whole result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--die-host", type=int, default=-1)
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    info = init_distributed(heartbeat_timeout_s=100)  # the launcher's env value wins
    assert jax.process_count() == info.process_count == 2, jax.process_count()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    total = global_sum(mesh)
    gathered = multihost_utils.process_allgather(jnp.array(info.process_index)).tolist()
    print(f"PSUM host={info.process_index} pid={os.getpid()} count={info.process_count} "
          f"devices={mesh.devices.size} total={total} gathered={gathered}", flush=True)
    while args.hang:
        time.sleep(1.0)
    if info.process_index == args.die_host:
        print(f"DYING at {time.time():.3f}", file=sys.stderr, flush=True)
        while True:
            time.sleep(1.0)
    if args.die_host >= 0:
        print(f"WAITING at {time.time():.3f}", file=sys.stderr, flush=True)
        multihost_utils.sync_global_devices("never completes: a peer is dead")
        global_sum(mesh)
        print("UNREACHABLE: collective finished without the dead host", flush=True)
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())

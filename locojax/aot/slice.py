"""A slice's devices split into the plan's hosts, as the runtime's processes would see them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compiler.plan import ExecutionPlan


@dataclass(frozen=True)
class SliceHosts:
    """The devices of each host of the plan (host index = the JAX process index)."""

    devices: tuple[tuple, ...]

    def of(self, hosts: Sequence[int]) -> list:
        """The devices of `hosts`, in host order (a group's `jax.devices()`)."""
        return [d for h in sorted(hosts) for d in self.devices[h]]


def slice_hosts(plan: ExecutionPlan, devices: Sequence) -> SliceHosts:
    """`devices` by host: by `process_index` where they span processes (a multi-host TPU
    topology), else in consecutive blocks of the plan's devices per host (e.g. CPU devices
    standing in for several hosts). ValueError when they are not the plan's machine."""
    topo = plan.topology
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    if len(devices) != topo.devices:
        raise ValueError(f"the plan wants {topo.hosts} hosts x {topo.devices_per_host} devices "
                         f"= {topo.devices}; {len(devices)} devices were given")
    processes = sorted({d.process_index for d in devices})
    if len(processes) > 1:
        groups = tuple(tuple(d for d in devices if d.process_index == p) for p in processes)
    else:
        per = topo.devices_per_host
        groups = tuple(tuple(devices[i:i + per]) for i in range(0, len(devices), per))
    if len(groups) != topo.hosts or any(len(g) != topo.devices_per_host for g in groups):
        raise ValueError(f"the plan wants {topo.hosts} hosts x {topo.devices_per_host} devices; "
                         f"the devices span {len(groups)} processes of "
                         f"{sorted({len(g) for g in groups})} devices")
    return SliceHosts(groups)

"""What a run's processes listen on: every TCP socket in LISTEN state of a process tree, and
whether an address is loopback (the network-exposure checks of the CO and DA runs)."""

import ipaddress
import subprocess
import time
from pathlib import Path

import psutil


def listening(pid: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket process `pid` and its descendants
    listen on."""
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    names = {p.pid: p.name() for p in tree}
    return [(c.laddr.ip, c.laddr.port, names[c.pid]) for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in names]


def listening_once_stepping(run: subprocess.Popen, metrics: Path
                            ) -> list[tuple[str, int, str]]:
    """`listening(run.pid)`, taken once the run's first step's row is written (every host
    and actor is up)."""
    deadline = time.monotonic() + 600
    while not (metrics.exists() and metrics.read_text().strip()):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.1)
    return listening(run.pid)


def loopback(ip: str) -> bool:
    """Whether `ip` (v4, v6 or v4-mapped v6) is a loopback address."""
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback

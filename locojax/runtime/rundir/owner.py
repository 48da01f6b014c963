"""Whose a run directory is, and whether what it holds has the shapes a run expects.

    check_ours(run_dir, reuse)  a directory that holds files and no LoCoJAX marker
                                (`files.MARKERS`; Hydra's own `.hydra*/` and `<job>.log`, which
                                Hydra writes before our code runs, and another host's write
                                probe do not count) is someone
                                else's: refused (`RunDirError`) unless `run.reuse_dir=true`
    check_layout(run_dir)       every name of the run's layout (`files.LAYOUT`) that exists is
                                a file or a directory as the run expects, readable, and no
                                symbolic link that loops or points nowhere (a file: no link
                                at all, the run writes it); likewise each step under
                                checkpoints/
    RunDirLock(run_dir)         an exclusive `flock` on `<run dir>/.locojax.lock` (a regular
                                file, opened without following a link) for the run's
                                lifetime, and a lease in it: the holder's pid, host, a token
                                of its own and a heartbeat it renews every LEASE_BEAT_S; a
                                second run of the directory is refused naming them. One
                                process per run takes it (CO: host 0; DA and the single
                                controller: the driver), so the hosts of one run never refuse
                                each other; the kernel drops the flock when that process ends,
                                however it ends.

The lease covers the filesystems whose `flock` succeeds without excluding anyone (gcsfuse;
NFS mounted `nolock`; Lustre without `-o flock`; two nodes of a cluster on any of them): a
run that got the flock still refuses a lease whose holder is alive (same host: its pid
runs; another host: a heartbeat within LEASE_TTL_S), and the holder whose lease another run
has taken over (its heartbeat stalled past LEASE_TTL_S) stops at its next beat without
writing another file (one line, exit 2).

Every refusal is one line naming the path and what to do (`RunDirError`, exit 2); nothing is
written before these checks pass but the lock file itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import threading
import time
import uuid
from pathlib import Path

from locojax.runtime.errors import RunDirError
from locojax.runtime.rundir.files import (
    CHECKPOINTS_DIR,
    LAYOUT,
    LOCK_FILE,
    MARKERS,
    PROBE_PREFIX,
    step_of,
)

LEASE_BEAT_S = 5.0
"""How often the holder renews its lease (and checks it still holds it)."""
LEASE_TTL_S = 30.0
"""A lease of another host not renewed for this long is stale: its run is gone."""
SHOWN = 3
"""Entries of a foreign directory named in its line."""
HOLDER_WAIT_S = 2.0
"""How long a refused run waits for the holder to have written its pid and host."""


def _not_foreign(name: str) -> bool:
    """Files in a run directory that say nothing about whose it is: Hydra's own (`.hydra/`,
    `.hydra-host<i>/` on host i, the job's log `__main__.log`), which Hydra writes before our
    code runs, and the write probe another host of this run may hold for a moment."""
    return name.startswith((".hydra", PROBE_PREFIX)) or name.endswith(".log")


def check_ours(run_dir: Path, reuse: bool) -> None:
    """`RunDirError` when `run_dir` holds files but is no LoCoJAX run directory (and
    run.reuse_dir is not set)."""
    names = sorted(os.listdir(run_dir))
    if reuse or any(name in names for name in MARKERS):
        return
    foreign = [n for n in names if not _not_foreign(n)]
    if foreign:
        more = f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else ""
        raise RunDirError(f"hydra.run.dir={run_dir}: not empty and not a LoCoJAX run directory "
                          f"(it holds {', '.join(foreign[:SHOWN])}{more}); use a new "
                          "hydra.run.dir, or run.reuse_dir=true to write this run into it")


def _problem(path: Path, want_dir: bool) -> str | None:
    """What is wrong with `path` as one of the run's files (`want_dir`: a directory), or None
    (fine, or absent). A file the run writes may not be a symbolic link (the run would write
    through it, into the link's target); a directory may (checkpoints on another disk)."""
    if not want_dir and path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)}), where the run writes a file of its own"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"a symbolic link to nothing ({os.readlink(path)})" if path.is_symlink() else None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symbolic link that loops"
        return f"cannot be read ({err.strerror})"
    want = "a directory" if want_dir else "a file"
    if want_dir != stat.S_ISDIR(st.st_mode) or not (want_dir or stat.S_ISREG(st.st_mode)):
        got = "a directory" if stat.S_ISDIR(st.st_mode) else (
            "a file" if stat.S_ISREG(st.st_mode) else "neither file nor directory")
        return f"{got}, where the run keeps {want}"
    if not os.access(path, os.R_OK | os.W_OK | (os.X_OK if want_dir else 0)):
        return "cannot be read or written (permissions)"
    return None


def check_layout(run_dir: Path) -> None:
    """`RunDirError` naming the first file or directory of the run's layout that has the wrong
    type, cannot be read, or is a link that loops."""
    paths = {run_dir / name: is_dir for name, is_dir in LAYOUT.items()}
    for path, is_dir in paths.items():
        _refuse(path, _problem(path, is_dir))
    root = run_dir / CHECKPOINTS_DIR  # checked above: a directory, when it exists
    steps = sorted(p for p in root.iterdir() if step_of(p.name) is not None) \
        if root.is_dir() else []
    for path in steps:  # each a directory (Orbax's own files inside are Orbax's to judge)
        _refuse(path, _problem(path, True))


def _refuse(path: Path, problem: str | None) -> None:
    if problem:
        raise RunDirError(f"{path}: {problem}; move it away or use a new hydra.run.dir")


def _lease(path: Path, wait: bool = True) -> dict | None:
    """The lease the lock file holds ({pid, host, token, heartbeat}), waiting briefly for a
    holder that has only just taken it (`wait`); None when it holds none."""
    deadline = time.monotonic() + (HOLDER_WAIT_S if wait else 0.0)
    while True:
        try:
            held = json.loads(path.read_text())
        except (OSError, ValueError):
            held = None
        if _is_lease(held):
            return held
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


PID_MAX = 1 << 22
"""Above Linux's largest pid (`/proc/sys/kernel/pid_max` is at most 2**22)."""


def _is_lease(held: object) -> bool:
    """Whether `held` is a lease a run wrote: an object with a pid (an int in (0, PID_MAX])
    and a host name; a file of anything else holds no lease (it is taken over)."""
    if not isinstance(held, dict):
        return False
    pid = held.get("pid")
    return (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_MAX
            and isinstance(held.get("host"), str))


def _holder(held: dict | None) -> str:
    """'pid N on host H' of a lease."""
    return f"pid {int(held['pid'])} on host {held['host']}" if held else \
        "a process that did not say which"


def _alive(held: dict) -> bool:
    """Whether a lease's run still runs: on this host, its pid (not this process's); on
    another, a heartbeat within LEASE_TTL_S (a lock written before leases, without one: no)."""
    if held["host"] == socket.gethostname():
        try:
            os.kill(int(held["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return int(held["pid"]) != os.getpid()
    beat = held.get("heartbeat")
    return isinstance(beat, int | float) and time.time() - beat < LEASE_TTL_S


class RunDirLock:
    """The run's hold on its directory (context manager; `release` ends it early)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None
        self._token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        self._since = ""

    def acquire(self) -> RunDirLock:
        """Take the lock or raise `RunDirError` naming the run that holds it. The lock file is
        opened without following a symbolic link and must be a regular file: the holder's
        line is written into it, never into a file a link points at."""
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise RunDirError(f"{self.path}: a symbolic link (to {os.readlink(self.path)}); "
                                  "a run's lock is a file of its own: remove the link") from None
            raise RunDirError(f"{self.path}: cannot be opened ({err.strerror})") from err
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunDirError(f"{self.path}: not a regular file; remove it or use a new "
                              "hydra.run.dir")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise RunDirError(f"{self.path}: cannot be locked ({err.strerror})") from err
            self._refuse(_lease(self.path))
        held = _lease(self.path, wait=False)
        if held is None and os.fstat(fd).st_size:  # released locks are empty
            print(f"warning: {self.path}: holds no lease a run wrote (not JSON, or no pid and "
                  "host); taken over and written again", file=sys.stderr, flush=True)
        if held is not None and held.get("token") != self._token and _alive(held):
            os.close(fd)  # flock let us in, yet the lease's run lives: flock is not to be trusted
            self._refuse(held, " (this filesystem's flock did not stop it)")
        self._fd, self._since = fd, time.strftime("%Y-%m-%dT%H:%M:%S")
        self._renew()
        self._beater = threading.Thread(target=self._beat, name="run-dir-lease", daemon=True)
        self._beater.start()
        return self

    def _refuse(self, held: dict | None, why: str = "") -> None:
        beat = held.get("heartbeat") if held else None
        if held and held["host"] != socket.gethostname() and isinstance(beat, int | float):
            age = max(time.time() - beat, 0.0)
            why += (f"; its lease was renewed {age:.0f} s ago: if that run is gone, it lapses "
                    f"in {max(LEASE_TTL_S - age, 0):.0f} s")
        raise RunDirError(f"hydra.run.dir={self.path.parent}: another run is using it "
                          f"({_holder(held)}){why}; wait for it to end, or use a new "
                          "hydra.run.dir")

    def _renew(self) -> None:
        who = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                          "token": self._token, "heartbeat": time.time(),
                          "since": self._since})
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (who + "\n").encode(), 0)
        os.fsync(self._fd)

    def _beat(self) -> None:
        """Renew the lease every LEASE_BEAT_S while held; a lease another run has taken over
        ends this process at once (it writes nothing more into the directory)."""
        while not self._stop.wait(LEASE_BEAT_S):
            held = _lease(self.path, wait=False)
            if held is not None and held.get("token") not in (None, self._token):
                print(f"error: hydra.run.dir={self.path.parent}: another run took it over "
                      f"({_holder(held)}) while this one's lease went unrenewed for "
                      f"{LEASE_TTL_S:.0f} s; this run stops without writing more",
                      file=sys.stderr, flush=True)
                os._exit(2)
            with contextlib.suppress(OSError, TypeError):
                self._renew()

    def release(self) -> None:
        """Let another run have the directory (the file stays: it marks the directory ours)."""
        self._stop.set()
        if self._beater is not None and self._beater is not threading.current_thread():
            self._beater.join(timeout=LEASE_BEAT_S)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)  # no lease left: the next run need not wait
                os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

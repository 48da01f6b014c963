"""LOCOJAX_RAY_ADDRESS is checked before Ray is asked: an address that accepts no connection
within the stated time, or that is not host:port, is one line (issue 28 item 4)."""

import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.runtime.errors import UserError
from locojax.runtime.process.job import CPU_COLLECTIVE_FLAGS
from locojax.runtime.process.ray_cluster import (
    ADDRESS_TIMEOUT_S,
    ENV_ADDRESS,
    ENV_TMPDIR,
    ENV_WAIT,
    _seal,
    _temp_dir,
    actor_env,
    address_wait_s,
    check_address,
)


def test_an_address_nothing_listens_on_fails_within_the_stated_time():
    t0 = time.monotonic()
    with pytest.raises(UserError, match=rf"^{ENV_ADDRESS}=127.0.0.1:1: no Ray cluster answers "
                                        r"there within 2 s \(Connection refused\)"):
        check_address("127.0.0.1:1", timeout_s=2.0)
    # It retries for the stated time; the upper bound only tells a wait from a hang.
    assert 1.9 < time.monotonic() - t0 < 30.0


def test_the_wait_is_the_variables_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.delenv(ENV_WAIT, raising=False)
    assert address_wait_s() == ADDRESS_TIMEOUT_S
    monkeypatch.setenv(ENV_WAIT, "2.5")
    assert address_wait_s() == 2.5
    for bad in ("soon", "-1", "1e9"):
        monkeypatch.setenv(ENV_WAIT, bad)
        with pytest.raises(UserError, match=rf"^{ENV_WAIT}={bad}: expected seconds"):
            address_wait_s()


def test_an_address_that_accepts_passes_and_a_malformed_one_is_named():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_address(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2.0)
    with pytest.raises(UserError, match=rf"^{ENV_ADDRESS}=host:port6: not an address"):
        check_address("host:port6")


def test_seal_removes_the_write_bits_ray_gives_its_directories(tmp_path):
    (tmp_path / "r" / "session").mkdir(parents=True)
    for d in (tmp_path / "r", tmp_path / "r" / "session"):
        d.chmod(0o777)
    _seal(tmp_path)
    assert [oct(d.stat().st_mode & 0o777) for d in (tmp_path / "r", tmp_path / "r" / "session")
            ] == ["0o755", "0o755"]


def test_a_ray_tmpdir_of_the_users_is_never_chmod_ed(tmp_path, monkeypatch):
    """Issue 41: LOCOJAX_RAY_TMPDIR names the user's directory (it may be /tmp): the cluster
    gets a fresh 0700 directory inside it, removed after the run; the user's keeps its mode."""
    users = tmp_path / "shared"
    users.mkdir()
    users.chmod(0o1777)
    monkeypatch.setenv(ENV_TMPDIR, str(users))
    guard, ray_tmp, remove = _temp_dir(tmp_path / "run")
    assert guard.parent == users and ray_tmp.parent == guard and remove
    assert users.stat().st_mode & 0o7777 == 0o1777 and guard.stat().st_mode & 0o777 == 0o700
    monkeypatch.delenv(ENV_TMPDIR)
    short = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))  # Ray's socket paths fit below
    try:
        guard, _, remove = _temp_dir(short / "run" / "ray")  # the run directory's own, kept
        assert guard == short / "run" / "ray" and not remove
    finally:
        shutil.rmtree(short)


def test_an_actor_keeps_the_users_xla_flags_with_its_device_count(monkeypatch):
    """Both Ray modes' actors: the device count of the plan's hosts replaces the user's, every
    other XLA flag of the driver's environment is kept (it was overwritten)."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1 --xla_force_host_platform_device_count=8")
    plan = compile_plan(compose_config(["+experiment=arith_da", "mesh=cpu", "mesh.hosts=3",
                                        "mesh.devices_per_host=2",
                                        "placement.rollout_fraction=0.67"]))
    env = actor_env(plan, {"X": "1"})["env_vars"]
    waits = " ".join(f"{k}={v}" for k, v in CPU_COLLECTIVE_FLAGS.items())
    assert env["XLA_FLAGS"] == f"--xla_foo=1 {waits} --xla_force_host_platform_device_count=2"
    assert env["JAX_PLATFORMS"] == "cpu" and env["X"] == "1"

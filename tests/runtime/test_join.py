"""What the environment and `controller.*` say about the job, before anything joins: the
method, the numbers, the default run directory; and the lines the hosts agree or refuse with."""

import dataclasses

import pytest
from compiler_cases import make_config

from compiler import PlanError, compile_plan
from compiler.config import ControllerConfig, DistributedMode
from locojax.config.compose import job_output_subdir, job_run_dir
from locojax.launch.agree import check_topology, differences, flat
from locojax.launch.join import SINGLE, Formation, JoinMethod, plan_join
from locojax.runtime.errors import JobError
from locojax.runtime.process.job import job_from_env

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[001-004]", "SLURM_NTASKS": "4",
         "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}
AUTO = ControllerConfig()


def _controller(**fields) -> ControllerConfig:
    return dataclasses.replace(AUTO, **fields)


@pytest.mark.parametrize(("env", "method", "count", "rank", "name"), [
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "8",
      "JAX_PROCESS_ID": "3"}, "env", 8, 3, "job-10.0.0.1_1234"),
    (SLURM, "slurm", 4, 2, "slurm-4242"),
    ({**SLURM, "SLURM_STEP_ID": "1"}, "slurm", 4, 2, "slurm-4242.1"),
    ({"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911",
      "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "ompi", 2, 1,
     "ompi-1531576320"),
    ({"PMI_SIZE": "3", "PMI_RANK": "0"}, "mpich", 3, 0, None),
    ({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3", "TPU_WORKER_ID": "1"}, "gketpu", 4, None,
     "tpu-t-0"),
    ({"JOB_COMPLETION_INDEX": "2", "HOSTNAME": "grpo-2-x7k2p"}, "k8s", None, 2, "k8s-grpo"),
])
def test_job_from_env_names_the_method_numbers_and_job(env, method, count, rank, name):
    job = job_from_env(env)
    assert (job.method, job.num_processes, job.process_id, job.job_name) == (
        method, count, rank, name)


def test_no_job_and_a_slurm_batch_script_are_not_jobs():
    assert job_from_env({"HOME": "/root"}) is None
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}  # not an srun step
    assert job_from_env(batch) is None


def test_plan_join_follows_the_mode_then_config_then_environment():
    assert plan_join(_controller(distributed=DistributedMode.off), SLURM) is None
    assert plan_join(AUTO, SLURM) == JoinMethod("slurm", detect=True)
    assert plan_join(AUTO, {**SLURM, "SLURM_NTASKS": "1"}) is None  # a one-task job
    assert plan_join(AUTO, {}) == JoinMethod("detect", detect=True)  # JAX looks (TPU pods, ...)
    assert plan_join(AUTO, {}, ask_jax=False) is None  # mesh=cpu: alone, JAX not imported
    assert plan_join(AUTO, SLURM, ask_jax=False) == JoinMethod("slurm", detect=True)
    on = _controller(distributed=DistributedMode.on)
    assert plan_join(on, {}, ask_jax=False) == JoinMethod("detect", detect=True)
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert plan_join(AUTO, env) == JoinMethod("env", "h:1", 2, 1)
    by_hand = _controller(coordinator="h0:5000", num_hosts=4, host_index=3)
    assert plan_join(by_hand, SLURM) == JoinMethod("config", "h0:5000", 4, 3)  # config wins
    assert plan_join(_controller(coordinator="h0:5000"), SLURM) == JoinMethod(
        "config", "h0:5000", 4, 2)  # the rest from the environment


@pytest.mark.parametrize(("controller", "env", "line"), [
    (_controller(coordinator="h0:5000"), {},
     "controller.num_hosts: hosts started by hand need controller.coordinator=host:port, "
     "controller.num_hosts=N and controller.host_index=i on each host (missing: "
     "controller.num_hosts, controller.host_index)"),
    (_controller(coordinator="h0:5000", host_index=4), SLURM,
     "controller.host_index=4: must be below the 4 hosts of the job (0 on the coordinator's "
     "host)"),
    (AUTO, {"JAX_COORDINATOR_ADDRESS": "h:1"},
     "JAX_COORDINATOR_ADDRESS=h:1: also set JAX_NUM_PROCESSES and JAX_PROCESS_ID on every host"),
    (AUTO, {"PMI_SIZE": "2", "PMI_RANK": "1"},
     "an MPICH job of 2 processes (PMI_SIZE): JAX cannot find its coordinator; give "
     "controller.coordinator=<host 0>:<port> on every host (controller.num_hosts and host_index "
     "come from PMI_SIZE/RANK)"),
])
def test_a_job_that_is_not_whole_is_one_line(controller, env, line):
    with pytest.raises(JobError) as err:
        plan_join(controller, env)
    assert str(err.value) == line


@pytest.mark.parametrize(("controller", "line"), [
    (_controller(coordinator="h0", num_hosts=2, host_index=0),
     "controller.coordinator=h0: must be empty or host:port with a port in [1, 65535] (host 0's "
     "address and a free port)"),
    (_controller(coordinator="h0:5000", num_hosts=2, host_index=2),
     "controller.host_index=2: must be < controller.num_hosts when that is > 0 "
     "(controller.num_hosts=2)"),
    (_controller(distributed=DistributedMode.off, init_timeout_s=0),
     "controller.init_timeout_s=0: must be >= 1"),
])
def test_controller_values_out_of_range_are_the_compilers_line(controller, line):
    with pytest.raises(PlanError) as err:  # before joining, as `locojax.plan` says it
        plan_join(controller, {})
    assert str(err.value) == line


def test_mpich_with_a_coordinator_takes_its_numbers_from_pmi():
    plan = plan_join(_controller(coordinator="n0:6000"), {"PMI_SIZE": "2", "PMI_RANK": "1"})
    assert plan == JoinMethod("config", "n0:6000", 2, 1)


def test_default_run_dir_is_the_job_and_each_host_keeps_its_own_record(monkeypatch):
    for key in ("JAX_COORDINATOR_ADDRESS", "OMPI_MCA_orte_hnp_uri", "PMI_SIZE",
                "JOB_COMPLETION_INDEX", "TPU_WORKER_HOSTNAMES", *SLURM):
        monkeypatch.delenv(key, raising=False)
    assert job_run_dir("auto", "", "2026-12-01/12-00-00") == "2026-12-01/12-00-00"
    assert job_output_subdir("auto", "", -1) == ".hydra"
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    assert job_run_dir("auto", "", "t") == "slurm-4242"
    assert job_output_subdir("auto", "", -1) == ".hydra-host2"
    assert job_run_dir("off", "", "t") == "t" and job_output_subdir("off", "", -1) == ".hydra"
    assert job_run_dir("auto", "h0:5000", "t") == "job-h0_5000"
    assert job_output_subdir("auto", "h0:5000", 0) == ".hydra"


def test_differences_name_each_key_with_its_value_per_host():
    hosts = [flat({"run": {"seed": 0, "steps": 3}, "mesh": {"kind": "auto"}}),
             flat({"run": {"seed": 7, "steps": 3}, "mesh": {"kind": "auto"}}),
             flat({"run": {"seed": 0, "steps": 3}})]
    assert differences(hosts) == ['mesh.kind is "auto" on hosts 0, 1, (absent) on host 2',
                                  "run.seed is 0 on hosts 0, 2, 7 on host 1"]
    assert differences(hosts[:1] * 3) == []


def test_the_plan_must_be_for_the_hosts_that_joined():
    two = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 2, "devices_per_host": 1}))
    check_topology(two, SINGLE)  # not joined: the local emulation starts the hosts
    with pytest.raises(JobError) as err:
        check_topology(two, Formation("slurm", 3, 0))
    assert str(err.value) == ("mesh.hosts: the plan is for 2 hosts, but 3 processes joined the "
                              "job (slurm); use mesh=auto or start one process per host")
    tpu = compile_plan(make_config(model="qwen3_0_6b", workload="gsm8k", hardware="v5p",
                              mesh={"kind": "tpu", "chips": 16}))
    with pytest.raises(JobError) as err:
        check_topology(tpu, SINGLE)
    assert str(err.value).startswith(f"mesh.chips: the plan is for {tpu.topology.hosts} hosts, "
                                     "but this process joined no multi-process job")


def _gathered_by(monkeypatch, texts_of_others: list[str]):
    """`all_gather_text` as two hosts would answer it: this host first, then the others."""
    from locojax.runtime.process import distributed

    monkeypatch.setattr(distributed, "all_gather_text",
                        lambda name, text, timeout_s: [text, *texts_of_others])


def test_a_check_refused_on_one_host_stops_every_host(monkeypatch):
    from locojax.launch.agree import on_every_host
    from locojax.runtime.errors import RunDirError

    def refused():
        raise RunDirError("/runs/r1: not writable")

    _gathered_by(monkeypatch, [""])
    with pytest.raises(RunDirError):  # the host that failed: its own error
        on_every_host("rundir", refused, 2, 5)
    _gathered_by(monkeypatch, ["/runs/r1: not writable"])
    with pytest.raises(JobError) as err:  # the others: that line and where it came from
        on_every_host("rundir", lambda: None, 2, 5)
    assert str(err.value) == "/runs/r1: not writable (on host 1)"
    _gathered_by(monkeypatch, [""])
    on_every_host("rundir", lambda: None, 2, 5)  # all passed
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        on_every_host("rundir", lambda: 1 / 0, 2, 5)

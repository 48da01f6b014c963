"""The single controller's driver does a whole step's host work without starting JAX: it owns
no devices (checked in a fresh process, since this one has JAX running)."""

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
from paths import ROOT

from locojax.runtime.process.ray_cluster import interrupted

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    import numpy as np
    from compiler_cases import make_config
    from compiler.pipeline import compile_plan
    from locojax.data import PromptStream, load_workload
    from locojax.data.stream import DataPosition
    from locojax.rewards import Scorer
    from locojax.runtime import assemble
    from locojax.runtime.hostwork import Completions, HostTimes, HostWork
    import locojax.single.driver  # noqa: F401  (everything the driver imports)

    plan = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 2, "devices_per_host": 1},
                               controller="single"))
    tok = assemble.tokenizer_for(plan.model.config, plan.model.config.vocab)
    workload = load_workload(assemble.workload_settings(plan.workload), 0)
    stream = PromptStream(len(workload.train), plan.batch.prompts_per_step, DataPosition(0))
    problems = [workload.train[int(i)] for i in stream.batch(0, 0, plan.batch.prompts_per_step)]
    with Scorer(assemble.reward_settings(plan.workload), workers=2) as scorer:
        work = HostWork(plan, tok, scorer)
        prompts = work.encode(problems)
        g, t = plan.batch.group_size, plan.batch.response_len
        rng = np.random.default_rng(0)
        b = len(problems) * g
        ids = np.concatenate([np.repeat(prompts.ids_BxP, g, axis=0),
                              rng.integers(3, plan.model.config.vocab, (b, t))], axis=1)
        out = Completions(tokens_BxL=ids.astype(np.int32), mask_BxT=np.ones((b, t), bool),
                          logp_model_BxT=np.full((b, t), -1.0, np.float32),
                          logp_BxT=np.full((b, t), -1.0, np.float32),
                          lengths_B=np.full(b, t, np.int32),
                          prompt_len_B=np.repeat(prompts.len_B, g))
        times = HostTimes()
        rows, rewards = work.process(out, problems, times)
    assert rows["tokens_BxL"].shape == (b, plan.batch.max_prompt_len + t)
    assert times.samples == b and len(rewards.rewards_B) == b
    from jax._src import xla_bridge
    assert not xla_bridge._backends, f"a JAX backend was started: {list(xla_bridge._backends)}"
    print("ok")
""")


def test_the_driver_does_host_work_without_a_jax_backend():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def _completions(b: int, width: int, t: int):
    from locojax.runtime.hostwork import Completions

    return Completions(tokens_BxL=np.full((b, width + t), 5, np.int32),
                       mask_BxT=np.ones((b, t), bool),
                       logp_model_BxT=np.zeros((b, t), np.float32),
                       logp_BxT=np.zeros((b, t), np.float32), lengths_B=np.arange(b) % t,
                       prompt_len_B=np.full(b, 2, np.int32))


def test_a_workers_greedy_rows_are_padded_to_its_replicas_and_cut_back():
    from locojax.runtime.hostwork import Prompts
    from locojax.single.worker import _eval_rows, _padded

    p = Prompts(np.arange(6, dtype=np.int32).reshape(3, 2), np.array([2, 1, 2], np.int32), 1)
    padded = _padded(p, 1)
    assert padded.ids_BxP.shape == (4, 2) and padded.ids_BxP[3].tolist() == [0, 1]
    assert padded.len_B.tolist() == [2, 1, 2, 2] and padded.truncated == 1
    assert _padded(p, 0) is p
    sent = []

    def generate(q):
        sent.append(q.len_B.tolist())
        return _completions(len(q.len_B), 2, 3)

    cut = _eval_rows(p, 2, 3, 1, generate)
    assert sent == [[2, 1, 2, 2]]  # padded to the 2 replicas, then cut back
    assert all(len(getattr(cut, f.name)) == 3 for f in dataclasses.fields(cut))
    assert cut.lengths_B.tolist() == [0, 1, 2]


def test_greedy_eval_with_a_host_share_of_no_problems_samples_nothing_there():
    """eval_prompts < hosts: a host's share is empty (CO counts 0 for it); the driver encodes
    it, its worker samples nothing, and the hosts' rows still concatenate and decode."""
    from compiler_cases import make_config

    from compiler.pipeline import compile_plan
    from locojax.data import load_workload, shard
    from locojax.runtime import assemble
    from locojax.runtime.hostwork import Completions, HostWork
    from locojax.single.worker import _eval_rows

    plan = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 2, "devices_per_host": 1},
                               controller="single"))
    work = HostWork(plan, assemble.tokenizer_for(plan.model.config, plan.model.config.vocab),
                    scorer=None)  # encode and decode only: no scoring here
    problems = load_workload(assemble.workload_settings(plan.workload), 0).eval[:1]
    shares = [shard(problems, h, 2) for h in range(2)]
    assert [len(s) for s in shares] == [1, 0]
    prompts = [work.encode(s) for s in shares]
    width, t = plan.batch.max_prompt_len, plan.batch.response_len
    assert prompts[1].ids_BxP.shape == (0, width) and prompts[1].len_B.shape == (0,)
    sent = []

    def generate(q):
        sent.append(len(q.len_B))
        return _completions(len(q.len_B), width, t)

    parts = [_eval_rows(q, 1, t, 1, generate) for q in prompts]
    assert sent == [1]  # the empty share is never sampled
    assert parts[1].tokens_BxL.shape == (0, width + t) and parts[1].mask_BxT.shape == (0, t)
    out = Completions.concat(parts)
    assert out.tokens_BxL.shape == (1, width + t) and len(work.texts(out)) == 1


def test_a_plain_keyboard_interrupt_is_one_line(capsys):
    # A plain KeyboardInterrupt (a driver run in process, no entry point's handlers): one line,
    # 130; a signal outside the loop under the entry point is stop.Interrupted (test_guard).
    assert interrupted() == 130
    line = ("interrupted: Ray shut down; rerun the same command to resume from the last "
            "checkpoint\n")
    assert capsys.readouterr().err == line

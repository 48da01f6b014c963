"""The single controller's driver does a whole step's host work without starting JAX: it owns
no devices (checked in a fresh process, since this one has JAX running)."""

import subprocess
import sys
import textwrap

from paths import ROOT

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    import numpy as np
    from compiler_cases import make_config
    from compiler.compile import compile
    from locojax.data import PromptStream, load_workload
    from locojax.data.stream import DataPosition
    from locojax.rewards import Scorer
    from locojax.runtime import assemble
    from locojax.runtime.hostwork import Completions, HostTimes, HostWork
    import locojax.single.driver  # noqa: F401  (everything the driver imports)

    plan = compile(make_config(mesh={"kind": "cpu", "hosts": 2, "devices_per_host": 1},
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


def test_a_workers_greedy_rows_are_padded_to_its_replicas_and_cut_back():
    import dataclasses

    import numpy as np

    from locojax.runtime.hostwork import Completions, Prompts
    from locojax.single.worker import _first_rows, _padded

    p = Prompts(np.arange(6, dtype=np.int32).reshape(3, 2), np.array([2, 1, 2], np.int32), 1)
    padded = _padded(p, 1)
    assert padded.ids_BxP.shape == (4, 2) and padded.ids_BxP[3].tolist() == [0, 1]
    assert padded.len_B.tolist() == [2, 1, 2, 2] and padded.truncated == 1
    assert _padded(p, 0) is p
    c = Completions(tokens_BxL=np.zeros((4, 5), np.int32), mask_BxT=np.ones((4, 3), bool),
                    logp_model_BxT=np.zeros((4, 3), np.float32),
                    logp_BxT=np.zeros((4, 3), np.float32), lengths_B=np.arange(4),
                    prompt_len_B=np.full(4, 2))
    cut = _first_rows(c, 3)
    assert all(len(getattr(cut, f.name)) == 3 for f in dataclasses.fields(cut))
    assert cut.lengths_B.tolist() == [0, 1, 2]

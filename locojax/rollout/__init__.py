"""Rollout: exact token sampling and whole-generation compiled programs.

Shapes: B rows (prompts x G), P padded prompt length, T new tokens, V vocab.

Sampler (`sampler.py`)
    SamplingSettings(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16,
                     stop_ids=(), pad_id=0)           frozen, hashable (a static jit argument)
    sample(logits_BxV, key, settings) -> Draw(ids_B, logp_B, logp_model_B)
        temperature 0 is greedy; otherwise an exact draw from softmax(logits / temperature),
        cut to the top_k, then to the top_p nucleus, renormalised. logp_B is the log-prob under
        that sampling distribution (the behaviour policy), logp_model_B under the model
        softmax at the sampling temperature without truncation (what the trainer scores at
        that temperature; equal to logp_B when nothing is cut; temperature 1 when greedy).

Engine (`engine.py`, programs in `prefill.py` and `slots.py`, static facts in `layout.py`)
    generate(model | (graphdef, params), prompts, settings, key, *, group_size=1,
             mesh=None, batch_axis=MeshAxis.REPLICA, tensor_axis=MeshAxis.TENSOR,
             options=EngineOptions(slots=0, schedule='refill', prefill='shared',
                                   cpu_kernels='auto', kv_dtype=None)) -> Rollout
        prompts: ragged id lists or (left-padded prompt_PxW, prompt_len_P). Two compiled
        programs: the prefill (each prompt once; its KV into a store, token 0 of its G rows)
        and one while loop that runs the B = P x G rows through `slots` resident rows, a
        stopped row's slot taking the next pending row (its prompt's KV copied in). Each
        row's draws are keyed by (key, row id, token index): slots, schedule and mesh never
        change a row's tokens. With a mesh, rows split over `batch_axis` (one loop per
        replica) and parameters keep the sharding they arrive with (the plan's rollout
        specs over `tensor_axis`), the KV cache split by kv head. `cpu_kernels` auto|on|off
        picks the backend (`backend.py`).
    generate_timed(...) -> (Rollout, prefill seconds); compile_programs(...) -> the two
        compiled programs (e.g. for memory_analysis()); lower_programs(...) -> the two
        lowered (their StableHLO: `scripts/rollout_hlo.py`).
    Rollout.stats: SlotStats(decode_steps_R, live_slot_steps_R, slots, prefill_rows).

Backend (`backend.py`)
    choose(mode, params, mesh) -> Backend (XLA | CPU_KERNELS); auto logs its choice once
    KernelSwitch (compiler.vocab): auto | on | off. On a CPU, with every row on one device and
    fp32 weights, the layer matrices and the output matrix go through `locojax.kernels`' panel
    matmul (packed once per call) and decode attention through its kernel, handed to the
    model as its `ModelOps`.

Results
    Rollout(tokens_BxL, completion_BxT, logp_BxT, logp_model_BxT, mask_BxT, lengths_B,
            prompt_len_B); rows of one prompt are adjacent (row p*G + g);
        .positions_BxL(), .valid_BxL(): what a teacher-forced forward over tokens_BxL needs.
    pad_prompts(prompts, pad_id=0, length=None) -> (prompt_BxP, prompt_len_B)
"""

from locojax.rollout.engine import (
    EngineOptions,
    Prefill,
    Rollout,
    SlotStats,
    generate,
    generate_timed,
    pad_prompts,
    positions,
)
from locojax.rollout.sampler import Draw, SamplingSettings, sample

__all__ = [
    "Draw",
    "EngineOptions",
    "Prefill",
    "Rollout",
    "SamplingSettings",
    "SlotStats",
    "generate",
    "generate_timed",
    "pad_prompts",
    "positions",
    "sample",
]

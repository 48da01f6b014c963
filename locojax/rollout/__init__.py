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

Engine (`engine.py`)
    generate(model | (graphdef, params), prompts, settings, key, *, group_size=1,
             mesh=None, batch_axis='replica', cpu_kernels='auto') -> Rollout
        prompts: ragged id lists or (left-padded prompt_BxP, prompt_len_B); one compiled
        program per (model, settings, shapes, group size, sharding, backend). With a mesh,
        rows are sharded over `batch_axis` and parameters replicated unless already on that
        mesh. `cpu_kernels` auto|on|off picks the backend (`backend.py`): on a CPU, with every
        row on one device and fp32 weights, the layer matrices and the output matrix go
        through `locojax.kernels`' panel matmul (packed once per call) and each decode step's
        attention through its decode-attention kernel, handed to the model as its
        `ModelOps`: ~1.5x the tokens/s of XLA's on the benchmark workload (paired).

Backend (`backend.py`)
    choose(mode, params, mesh) -> Backend (XLA | CPU_KERNELS); auto logs its choice once
    KernelMode: auto | on | off
    Rollout(tokens_BxL, completion_BxT, logp_BxT, logp_model_BxT, mask_BxT, lengths_B,
            prompt_len_B); rows of one prompt are adjacent (row p*G + g);
        .positions_BxL(), .valid_BxL(): what a teacher-forced forward over tokens_BxL needs.
    pad_prompts(prompts, pad_id=0, length=None) -> (prompt_BxP, prompt_len_B)
"""

from locojax.rollout.engine import Rollout, generate, pad_prompts, positions
from locojax.rollout.sampler import Draw, SamplingSettings, sample

__all__ = [
    "Draw",
    "Rollout",
    "SamplingSettings",
    "generate",
    "pad_prompts",
    "positions",
    "sample",
]

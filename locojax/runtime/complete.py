"""One prompt's completion under a configuration: the work of `python -m locojax.sample`."""

from __future__ import annotations

import sys

import jax
from flax import nnx

from locojax.model import Qwen3, abstract_model, load_hf_checkpoint, split_params
from locojax.rollout.engine import generate
from locojax.runtime.assemble import (
    UserError,
    checkpoint_dir,
    model_arch,
    sampling_settings,
    tokenizer_for,
)
from locojax.tokenizers import Tokenizer, apply_chat_template


def complete(cfg) -> tuple[list[int], Tokenizer]:
    """Token ids of the completion of `cfg.prompt` under `cfg.model` and `cfg.sampling`."""
    ckpt = checkpoint_dir(cfg.model)
    if ckpt is not None:
        arch, params = load_hf_checkpoint(ckpt)
        model = (abstract_model(arch)[0], params)
    else:
        arch = model_arch(cfg.model)
        model = split_params(Qwen3(arch, rngs=nnx.Rngs(cfg.run.seed)))
    tokenizer = tokenizer_for(cfg.model, arch.vocab)
    prompt = cfg.prompt or sys.stdin.read()
    if not prompt:
        raise UserError("prompt: empty (pass \"prompt='...'\" or text on standard input)")
    if cfg.chat:
        prompt = apply_chat_template([{"role": "user", "content": prompt}])
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as err:
        raise UserError(f"prompt: {err}") from err
    settings = sampling_settings(cfg.sampling, cfg.workload.max_response_len, tokenizer)
    out = generate(model, [ids], settings, jax.random.key(cfg.run.seed))
    n = int(out.lengths_B[0])
    completion = [int(t) for t in out.completion_BxT[0, :n]]
    if completion and completion[-1] in settings.stop_ids:
        completion = completion[:-1]
    return completion, tokenizer

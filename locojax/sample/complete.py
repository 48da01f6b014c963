"""One prompt's completion under a configuration: the work of `python -m locojax.sample`."""

from __future__ import annotations

import resource
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from locojax.model import (
    CheckpointError,
    ModelArch,
    Qwen3,
    abstract_model,
    load_hf_checkpoint,
    split_params,
)
from locojax.rollout.backend import KernelsUnavailable
from locojax.rollout.engine import generate
from locojax.runtime.assemble import (
    check_family,
    checkpoint_dir,
    engine_options,
    model_arch,
    sampling_settings,
    tokenizer_for,
)
from locojax.runtime.errors import UserError
from locojax.tokenizers import Tokenizer

STDIN_LIMIT = 8 << 20
"""Bytes of a prompt read from standard input at most: an unbounded stream (`yes |`) is
refused once past it instead of filling the memory (a prompt of a model's longest context
is well under 1 MiB)."""


def read_stdin() -> str:
    """The prompt from standard input, strictly UTF-8 and at most `STDIN_LIMIT` bytes; one
    error line when it is not."""
    if sys.stdin is None:
        raise UserError("prompt: empty and standard input is closed (pass \"prompt='...'\")")
    data = sys.stdin.buffer.read(STDIN_LIMIT + 1)
    if len(data) > STDIN_LIMIT:
        raise UserError(f"prompt: standard input holds more than {STDIN_LIMIT >> 20} MiB; a "
                        "prompt is read whole, so pass a file of one prompt")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"prompt: standard input is not UTF-8 (byte {data[err.start]:#04x} at "
                        f"offset {err.start})") from err


def sampling_bytes(arch: ModelArch, prompt_len: int, new_tokens: int) -> int:
    """Memory one prompt's generation needs: its KV cache (every layer, prompt + new tokens)
    and the prefill's largest temporaries, one layer's fp32 attention scores (heads x L x L)
    and the last position's logits."""
    cache = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * (prompt_len + new_tokens)
    scores = arch.num_heads * prompt_len * prompt_len
    return cache * jnp.dtype(arch.jnp_dtype).itemsize + 4 * (scores + arch.vocab)


def free_memory_bytes() -> int | None:
    """Memory this process may still allocate: the first device's limit on accelerators, else
    MemAvailable, less what an address-space limit (ulimit -v) leaves; None if unknown."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
        return None
    try:
        info = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines())
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        except (OSError, ValueError):
            used = 0
        free = min(free, soft - used)
    return free


def check_length(arch: ModelArch, prompt_len: int, new_tokens: int) -> None:
    """One error line when the prompt cannot be sampled: past `max_position`, or more memory
    than is free (checked before anything is allocated)."""
    total = prompt_len + new_tokens
    if total > arch.max_position:
        raise UserError(f"prompt: {prompt_len} tokens + sampling.max_new_tokens={new_tokens} = "
                        f"{total} exceeds the model's max_position={arch.max_position}")
    need, free = sampling_bytes(arch, prompt_len, new_tokens), free_memory_bytes()
    if free is not None and need > free:
        raise UserError(f"prompt: {prompt_len} tokens need about {need / 2**30:.1f} GiB to sample "
                        f"(KV cache and prefill attention), {free / 2**30:.1f} GiB are free; "
                        "shorten the prompt")


def complete(cfg) -> tuple[list[int], Tokenizer]:
    """Token ids of the completion of `cfg.prompt` under `cfg.model` and `cfg.sampling`."""
    check_family(cfg.model)
    ckpt = checkpoint_dir(cfg.model)
    if ckpt is not None:
        try:
            arch, params = load_hf_checkpoint(ckpt)
        except CheckpointError as err:
            raise UserError(str(err)) from err
        model = (abstract_model(arch)[0], params)
    else:
        arch = model_arch(cfg.model)
        model = split_params(Qwen3(arch, rngs=nnx.Rngs(cfg.run.seed)))
    tokenizer = tokenizer_for(cfg.model, arch.vocab)
    prompt = cfg.prompt or read_stdin()
    if not prompt:
        raise UserError("prompt: empty (pass \"prompt='...'\" or text on standard input)")
    if cfg.chat:
        try:
            prompt = tokenizer.chat([{"role": "user", "content": prompt}],
                                    enable_thinking=cfg.workload.enable_thinking)
        except ValueError as err:
            raise UserError(f"chat: {err}") from err
    try:
        ids = tokenizer.encode_prompts([prompt])[0]
    except ValueError as err:
        raise UserError(f"prompt: {err}") from err
    settings = sampling_settings(cfg.sampling, cfg.workload.max_response_len, tokenizer)
    check_length(arch, len(ids), settings.max_new_tokens)
    try:
        out = generate(model, [ids], settings, jax.random.key(cfg.run.seed),
                       options=engine_options(cfg.sampling, cfg.sampling.slots,
                                              cfg.sampling.prompt_store))
    except KernelsUnavailable as err:
        raise UserError(f"sampling.cpu_kernels={cfg.sampling.cpu_kernels}: {err}") from err
    except jax.errors.JaxRuntimeError as err:
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        raise UserError(f"prompt: {len(ids)} tokens + {settings.max_new_tokens} new ran out of "
                        f"memory ({str(err).splitlines()[0][:160]}); shorten the prompt or "
                        "sampling.max_new_tokens") from err
    n = int(out.lengths_B[0])
    completion = [int(t) for t in out.completion_BxT[0, :n]]
    if completion and completion[-1] in settings.stop_ids:
        completion = completion[:-1]
    return completion, tokenizer

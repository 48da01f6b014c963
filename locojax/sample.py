"""`python -m locojax.sample`: complete one prompt with a checkpoint or random weights.

    python -m locojax.sample model.checkpoint=<hf dir> "prompt='What is 2+3?'" \
        sampling.temperature=0 sampling.max_new_tokens=32
    echo "2+3=" | python -m locojax.sample model=tiny model.tokenizer=char model.vocab=32

Prints the completion text and nothing else on stdout (`output=ids`: the token ids). Hydra
needs quotes around values holding `=`, `:` or `,`; an empty `prompt` reads standard input.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from locojax.assemble import UserError, checkpoint_dir, model_arch, sampling_settings, tokenizer_for
from locojax.configure import CONF_DIR, SampleOutput, register_schemas, to_config


def complete(cfg) -> list[int]:
    """Token ids of the completion of `cfg.prompt` under `cfg.model` and `cfg.sampling`."""
    import jax
    from flax import nnx

    from locojax.model import Qwen3, load_hf_checkpoint, split_params
    from locojax.rollout.engine import generate
    from locojax.tokenizers import apply_chat_template

    ckpt = checkpoint_dir(cfg.model)
    if ckpt is not None:
        arch, params = load_hf_checkpoint(ckpt)
        from locojax.model import abstract_model

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


@hydra.main(config_path=str(CONF_DIR), config_name="sample", version_base=None)
def main(raw: DictConfig) -> None:
    """Print the completion of the prompt."""
    cfg = to_config(raw)
    try:
        ids, tokenizer = complete(cfg)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if cfg.output == SampleOutput.ids:
        print(" ".join(map(str, ids)))
    else:
        print(tokenizer.decode(ids))


if __name__ == "__main__":
    register_schemas()
    main()

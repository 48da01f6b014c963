"""The final policy as a Hugging Face model directory that serves as it is (`<run dir>/hf`).

    tokenizer.json, tokenizer_config.json     the run's own tokenizer, its special tokens and
    special_tokens_map.json                   (a vocabulary with Qwen3's turn markers) the
                                              chat template
    generation_config.json                    eos (every stop id), pad and the run's
                                              sampling defaults
    model.safetensors, config.json            the weights (`locojax.model.export_hf_checkpoint`)

`AutoTokenizer`, `AutoModelForCausalLM`, vLLM and SGLang read it with nothing added, and so
does `locojax-sample model.checkpoint=<run dir>/hf` (its tokenizer.json is the run's).
The trainer writes it into a new directory beside `hf/` and swaps it in whole, its marker
(`locojax_export.json`, the step) written last (`rundir.files.publish_export`): `hf/` is
never a mix of two exports, and one without the marker or of an older step is not the run's
final export (`rundir.files.export_complete`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from locojax.model import ModelArch, export_hf_checkpoint
from locojax.rollout.sampler import SamplingSettings
from locojax.tokenizers import Tokenizer, save_checkpoint_tokenizer
from locojax.tokenizers.chat import CHAT_TEMPLATE_JINJA
from locojax.tokenizers.hf_dir import has_chat_tokens


def generation_defaults(sampling: SamplingSettings) -> dict[str, Any]:
    """The run's sampling as `generation_config.json` fields (top_k 0 is written: HF's
    default would be 50)."""
    if sampling.temperature == 0:
        return {"do_sample": False, "max_new_tokens": sampling.max_new_tokens}
    return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "max_new_tokens": sampling.max_new_tokens}


def chat_template(tokenizer: Tokenizer, checkpoint: Path | None) -> str | None:
    """The template the export carries: the starting checkpoint's own when it has one, else
    Qwen3's for a vocabulary with its turn markers; None for one without (char)."""
    if checkpoint is not None and (checkpoint / "tokenizer_config.json").is_file():
        try:
            own = json.loads((checkpoint / "tokenizer_config.json").read_text()).get(
                "chat_template")
        except (OSError, ValueError):
            own = None
        if isinstance(own, str):
            return own
    return CHAT_TEMPLATE_JINJA if has_chat_tokens(tokenizer) else None


def export_policy(arch: ModelArch, params: Mapping[str, np.ndarray], tokenizer: Tokenizer,
                  sampling: SamplingSettings, checkpoint: Path | None, out_dir: Path) -> Path:
    """Write the whole export of `params` (a host copy at `arch.dtype`) into `out_dir`."""
    save_checkpoint_tokenizer(tokenizer, out_dir,
                              chat_template=chat_template(tokenizer, checkpoint),
                              generation=generation_defaults(sampling))
    return export_hf_checkpoint(arch, params, out_dir)

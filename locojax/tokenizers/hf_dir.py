"""Tokenizer of a local Hugging Face checkpoint directory (`tokenizer.json` + config files).

`load_checkpoint` reads one; `save_checkpoint_tokenizer` writes any LoCoJAX tokenizer as one, so
HF `AutoTokenizer`, tunix and TRL read the same ids (the GRPO benchmark hands its checkpoints
to them this way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers as tk

from locojax.tokenizers.base import Tokenizer


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_ids(value: Any) -> list[int]:
    """`eos_token_id`-style value (int, list of ints or null) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _token_string_id(backend: tk.Tokenizer, value: Any) -> int | None:
    """Id of a tokenizer_config token entry: a string or `{"content": ...}`."""
    content = value.get("content") if isinstance(value, dict) else value
    return backend.token_to_id(content) if isinstance(content, str) else None


def load_checkpoint(checkpoint_dir: str | Path) -> Tokenizer:
    """Tokenizer of `checkpoint_dir`; eos, pad and stops from generation/tokenizer configs.

    eos: tokenizer_config `eos_token`, else the first generation_config `eos_token_id`.
    stops: all generation_config eos ids, then eos. pad: generation_config `pad_token_id`,
    else tokenizer_config `pad_token`, else eos.
    """
    root = Path(checkpoint_dir)
    path = root / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in checkpoint directory {root}")
    backend = tk.Tokenizer.from_file(str(path))
    gen = _read_json(root / "generation_config.json")
    tcfg = _read_json(root / "tokenizer_config.json")

    gen_eos = _token_ids(gen.get("eos_token_id"))
    eos = _token_string_id(backend, tcfg.get("eos_token"))
    if eos is None:
        eos = gen_eos[0] if gen_eos else None
    if eos is None:
        raise ValueError(
            f"checkpoint {root}: no eos token in generation_config.json (eos_token_id) "
            "or tokenizer_config.json (eos_token)"
        )
    pad_ids = _token_ids(gen.get("pad_token_id"))
    pad = pad_ids[0] if pad_ids else _token_string_id(backend, tcfg.get("pad_token"))
    bos_ids = _token_ids(gen.get("bos_token_id"))
    bos = bos_ids[0] if bos_ids else _token_string_id(backend, tcfg.get("bos_token"))
    return Tokenizer(
        backend=backend,
        name=str(root),
        eos_id=eos,
        pad_id=eos if pad is None else pad,
        stop_ids=tuple(dict.fromkeys([*gen_eos, eos])),
        bos_id=bos,
    )


def save_checkpoint_tokenizer(tok: Tokenizer, out_dir: str | Path) -> Path:
    """Write `tok` as the tokenizer files of a checkpoint that `load_checkpoint` and HF read.

    tokenizer.json (the backend), tokenizer_config.json (eos, pad) and generation_config.json
    (every stop id as `eos_token_id`, so HF `generate` stops where LoCoJAX does). No bos token is declared (LoCoJAX never adds one, and readers such as tunix's sampler
    prepend a declared one); HF's clean-up of spaces before punctuation is off, so decoded
    text is the backend's own.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(out / "tokenizer.json"))
    eos = tok.backend.id_to_token(tok.eos_id)
    pad = tok.backend.id_to_token(tok.pad_id)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": pad,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    if tok.unk_id is not None:
        config["unk_token"] = tok.backend.id_to_token(tok.unk_id)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": list(tok.stop_ids), "pad_token_id": tok.pad_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out

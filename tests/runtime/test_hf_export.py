"""The final export is a whole Hugging Face model directory: read with `tokenizers` and
`safetensors` alone (tests/hf_reference.py; transformers lives only in the peers' venv) it
decodes greedily to our tokens, `locojax-sample model.checkpoint=<export>` needs no other key,
and its tokenizer files carry the special tokens, the chat template and the sampling defaults.
"""

from __future__ import annotations

import json

import jinja2.sandbox
import numpy as np
import pytest
from flax import nnx
from hf_reference import HfDir, greedy, same_greedy

from locojax.config.compose import compose_config
from locojax.envs.tools import tool_schema
from locojax.model import ModelArch, Qwen3, flat_params, split_params
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime.rundir.export import export_policy
from locojax.runtime.rundir.files import (
    EXPORT_FILES,
    EXPORT_MARKER,
    export_complete,
    export_staging,
    publish_export,
)
from locojax.sample.complete import complete
from locojax.tokenizers import apply_chat_template, load_tokenizer
from locojax.tokenizers.chat import CHAT_TEMPLATE_JINJA

ARCH = ModelArch(num_layers=2, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, ffn=128,
                 vocab=32, rope_theta=1e6)
PROMPT = "12+34="


def _export(tmp_path, tokenizer, arch=ARCH, seed=1):
    """A random model (seed 1: its greedy completion of PROMPT varies from token to token
    and changes with RoPE's base, so it tests the layout) exported with `tokenizer`."""
    params = split_params(Qwen3(arch, rngs=nnx.Rngs(seed)))[1]
    flat = {k: np.asarray(v[...]) for k, v in flat_params(params).items()}
    sampling = SamplingSettings(temperature=0.7, top_k=5, max_new_tokens=12,
                                stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id)
    staging = export_staging(tmp_path / "hf")  # as the trainer does
    export_policy(arch, flat, tokenizer, sampling, None, staging)
    return publish_export(staging, tmp_path / "hf", step=seed)


def test_an_export_is_whole_only_once_published_and_names_its_step(tmp_path):
    """Issue 41, item 3: a re-export killed before it finished never passes for complete.
    The export is written beside hf/ and swapped in with its marker (the step) written
    last; hf/ is the earlier export, none, or the new one."""
    char = load_tokenizer("char")
    out = _export(tmp_path, char, seed=2)
    assert export_complete(out, 2) and not export_complete(out, 3)
    first = (out / "model.safetensors").read_bytes()
    # A longer run's re-export killed mid-write: its staging holds files, no marker.
    killed = export_staging(out)
    (killed / "model.safetensors").write_bytes(b"half")
    assert export_complete(out, 2) and not export_complete(out, 3)
    assert (out / "model.safetensors").read_bytes() == first
    assert not export_complete(killed)  # every file or not, no marker: not an export
    again = _export(tmp_path, char, seed=3)  # the rerun: the leftovers go, step 3's is in
    assert export_complete(again, 3) and not killed.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    (again / EXPORT_MARKER).unlink()  # an export from before the marker: not complete
    assert not export_complete(again)
    # hf/ a link to another directory: replaced, the link gone, its target untouched
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    again.rename(elsewhere)
    again.symlink_to(elsewhere)
    linked = _export(tmp_path, char, seed=4)
    assert export_complete(linked, 4) and not linked.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert (elsewhere / "model.safetensors").is_file() and not export_complete(elsewhere)


def test_the_export_round_trips_greedily_through_tokenizers_and_safetensors(tmp_path):
    char = load_tokenizer("char")
    out = _export(tmp_path, char)
    assert export_complete(out) and all((out / f).is_file() for f in EXPORT_FILES)
    hf = HfDir.read(out)
    assert hf.tokenizer.encode(PROMPT, add_special_tokens=False).ids == char.encode(PROMPT)
    assert hf.generation["eos_token_id"] == list(char.stop_ids)
    assert (hf.generation["pad_token_id"], hf.generation["top_k"],
            hf.generation["temperature"]) == (char.pad_id, 5, 0.7)
    assert hf.tokenizer_config["eos_token"] == "<eos>" and "chat_template" not in \
        hf.tokenizer_config  # char has no turn markers
    ref, gaps = greedy(hf, PROMPT, 12)
    # locojax-sample's path with nothing but model.checkpoint: the tokenizer is the export's.
    cfg = compose_config([f"model.checkpoint={out}", f"prompt='{PROMPT}'",
                          "sampling.temperature=0", "sampling.max_new_tokens=12"],
                         config_name="sample")
    ours, tokenizer = complete(cfg)
    assert tokenizer.name == str(out) and len(set(ref)) >= 4, ref
    assert same_greedy(ours, ref, gaps), (ours, ref, gaps)


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"},
     {"role": "user", "content": "c"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b",
                                        "reasoning_content": "why"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>x</think>b"},
     {"role": "user", "content": "<tool_response>t</tool_response>"},
     {"role": "assistant", "content": "d"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"},
     {"role": "assistant",
      "content": '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'},
     {"role": "tool", "content": "5"}, {"role": "tool", "content": "é"},
     {"role": "assistant", "content": "<think>x</think>b"}],
    [{"role": "tool", "content": "5"}],
]


def add(a: int, b: int = 0) -> int:
    """Add two integers, é.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@pytest.mark.parametrize("tools", [None, [tool_schema(add)]])
@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_the_exported_chat_template_renders_as_ours(thinking, generation_prompt, tools):
    """Rendered as transformers renders chat templates (a sandbox, trim and lstrip blocks, its
    `tojson`: json.dumps with non-ASCII kept)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    template = env.from_string(CHAT_TEMPLATE_JINJA)
    for messages in CONVERSATIONS:
        got = template.render(messages=messages, add_generation_prompt=generation_prompt,
                              enable_thinking=thinking, tools=tools)
        assert got == apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                          enable_thinking=thinking, tools=tools), messages


def test_a_qwen3_export_carries_its_special_tokens_and_chat_template(tmp_path):
    qwen = load_tokenizer("qwen")
    arch = ModelArch(num_layers=1, hidden=16, num_heads=2, num_kv_heads=1, head_dim=8, ffn=32,
                     vocab=151936)
    out = _export(tmp_path, qwen, arch)
    hf = HfDir.read(out)
    config = hf.tokenizer_config
    assert (config["eos_token"], config["pad_token"]) == ("<|im_end|>", "<|endoftext|>")
    assert config["chat_template"] == CHAT_TEMPLATE_JINJA
    special = json.loads((out / "special_tokens_map.json").read_text())
    assert special == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert hf.generation["eos_token_id"] == [qwen.token_id("<|im_end|>"),
                                             qwen.token_id("<|endoftext|>")]
    text = apply_chat_template(CONVERSATIONS[0], enable_thinking=False)
    assert hf.tokenizer.encode(text, add_special_tokens=False).ids == qwen.encode(text)


def test_a_checkpoints_own_chat_template_is_kept(tmp_path):
    from locojax.runtime.rundir.export import chat_template

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert chat_template(load_tokenizer("char"), tmp_path) == "{{ x }}"
    assert chat_template(load_tokenizer("char"), None) is None

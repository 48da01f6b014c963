"""Hugging Face weights for training: read by slices straight onto the training shardings,
each box once, only the torch rows and columns it comes from."""


import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from paths import FIXTURES

from locojax.model import HfReader, abstract_model, flat_params, load_hf_checkpoint, load_hf_params
from locojax.train import param_shardings


def _specs(params) -> dict:
    """Shard something of every kind: heads and head_dim of q/k/v/o, both dims of the MLP,
    the vocabulary of embedding and head; data axis left replicated."""
    specs = {}
    for name, var in flat_params(params).items():
        spec = [None] * len(var.shape)
        if name.endswith(("q_proj", "o_proj")):
            spec[2 if name.endswith("q_proj") else 1] = "fsdp"  # heads
        elif name.endswith(("k_proj", "v_proj")):
            spec[3] = "fsdp"  # head_dim: whole heads are read, then cut
        elif name.endswith(("gate_proj", "up_proj", "down_proj")):
            spec[1] = "fsdp"
        elif name in ("embed/embedding", "lm_head/kernel"):
            spec[0 if name.startswith("embed") else 1] = "fsdp"
        specs[name] = tuple(spec)
    return specs


@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_qwen3_tied_sharded"])
def test_sliced_load_onto_shardings_equals_the_full_load(name, monkeypatch):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    arch, full = load_hf_checkpoint(FIXTURES / name)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))
    shardings = param_shardings(mesh, abstract_model(arch)[1], _specs(full))
    read = []
    original = HfReader.read
    monkeypatch.setattr(HfReader, "read", lambda self, n, idx=None: read.append(n) or
                        original(self, n, idx))
    params = load_hf_params(FIXTURES / name, arch, shardings, "float32")
    for n, var in flat_params(params).items():
        want = np.asarray(flat_params(full)[n][...])
        got = var[...]
        assert got.sharding == flat_params(shardings)[n].get_value(), n
        assert np.asarray(got).tobytes() == want.tobytes(), n
    # 4 distinct boxes per sharded parameter (the 2 data replicas share one read), 1 per
    # replicated one: no device reads what another already read.
    sharded = {n for n, s in _specs(full).items() if "fsdp" in s}
    assert sorted(read) == sorted([n for n in _specs(full) for _ in range(4 if n in sharded
                                                                          else 1)])


BOXES = [  # (fixture, our parameter, a box of it, the torch tensor and the slices read)
    # Qwen3's q weight: layer 1, 16 of D, heads 1-2 -> their rows, those 16 columns
    ("tiny_qwen3", "layers/attn/q_proj", (slice(1, 2), slice(8, 24), slice(1, 3), slice(0, 16)),
     ("model.layers.1.self_attn.q_proj.weight", [(16, 48), (8, 24)])),
    # Qwen2's q bias (H x hd ours, H*hd in torch): layer 0, heads 1-2, 8 of head_dim 16
    ("tiny_qwen2", "layers/attn/q_bias", (slice(0, 1), slice(1, 3), slice(4, 12)),
     ("model.layers.0.self_attn.q_proj.bias", [(16, 48)])),
]


@pytest.mark.parametrize("fixture,name,box,torch_read", BOXES, ids=["weight", "bias"])
def test_a_box_reads_only_its_torch_rows_and_columns(fixture, name, box, torch_read,
                                                     monkeypatch):
    from locojax.model import hf_io

    arch, full = load_hf_checkpoint(FIXTURES / fixture)
    reader = HfReader(FIXTURES / fixture, arch)
    seen = []
    original = hf_io._HfTensors.read
    monkeypatch.setattr(hf_io._HfTensors, "read",
                        lambda self, n, idx: seen.append((n, [(s.start, s.stop) for s in idx]))
                        or original(self, n, idx))
    got = reader.read(name, box)
    np.testing.assert_array_equal(got, np.asarray(flat_params(full)[name][...])[box])
    assert seen == [torch_read]

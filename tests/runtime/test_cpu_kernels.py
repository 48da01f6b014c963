"""The CPU kernels (XLA FFI calls): the panel matmul equal to XLA's dot, packing exact, decode
attention equal to the masked softmax, the rollout engine's results unchanged by them, a
clear reason when they cannot be used, and the model free of them (an injected backend)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from locojax.kernels import cpu as cpu_kernels
from locojax.model import ModelArch, Qwen3, ops, split_params
from locojax.rollout import backend, engine
from locojax.rollout.sampler import SamplingSettings

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(),
    reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}",
)


def _rand(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32))


@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 64), (5, 256, 128), (16, 256, 8192),
                                           (16, 768, 256), (13, 96, 192), (512, 256, 768)])
def test_matmul_equals_xla_dot(m, k, n):
    x, w = _rand((m, k), 0), _rand((k, n), 1)
    got = jax.jit(lambda x, w: cpu_kernels.panel_matmul(x, cpu_kernels.pack_panels(w)))(x, w)
    want = jnp.dot(x, w, precision="highest")
    # fp32 sums in another order: relative to the size of the terms, not of the result.
    scale = float(jnp.dot(jnp.abs(x), jnp.abs(w)).max())
    np.testing.assert_allclose(got, want, atol=2e-6 * scale, rtol=0)
    assert got.shape == (m, n) and got.dtype == jnp.float32


def test_leading_axes_and_split_agree():
    x, w = _rand((2, 3, 64), 2), _rand((64, 512), 3)
    packed = cpu_kernels.pack_panels(w)
    got = jax.jit(cpu_kernels.panel_matmul)(x, packed)
    assert got.shape == (2, 3, 512)
    # Eight panels are shared out over two threads, one panel runs alone: same numbers.
    one_by_one = jnp.concatenate(
        [cpu_kernels.panel_matmul(x, cpu_kernels.Panels(packed.panels_PxKx64[i : i + 1], (64,)))
         for i in range(8)], -1)
    shaped = cpu_kernels.pack_panels(w, out_shape=(8, 64))
    np.testing.assert_array_equal(cpu_kernels.panel_matmul(x, shaped), got.reshape(2, 3, 8, 64))
    np.testing.assert_array_equal(got, one_by_one)


def test_packing_is_exact_both_ways():
    w = _rand((96, 320), 4)
    packed = cpu_kernels.pack_panels(w).panels_PxKx64
    np.testing.assert_array_equal(packed, w.reshape(96, 5, 64).transpose(1, 0, 2))
    np.testing.assert_array_equal(cpu_kernels.pack_panels(w.T, transposed=True).panels_PxKx64,
                                  packed)
    assert cpu_kernels.Panels(packed, (320,)).shape == (96, 320)


def test_misuse_is_refused():
    assert not cpu_kernels.packable(jnp.zeros((64, 100)))
    assert not cpu_kernels.packable(jnp.zeros((64, 128), jnp.bfloat16))
    with pytest.raises(ValueError, match="multiple of 64"):
        cpu_kernels.pack_panels(jnp.zeros((64, 100)))
    with pytest.raises(ValueError, match="out_shape"):
        cpu_kernels.pack_panels(jnp.zeros((32, 128)), out_shape=(3, 64))
    w = cpu_kernels.pack_panels(jnp.zeros((32, 64)))
    with pytest.raises(ValueError, match="columns"):
        cpu_kernels.panel_matmul(jnp.zeros((3, 31)), w)


@pytest.mark.parametrize(("b", "k", "g", "hd", "s", "written"), [
    (16, 2, 2, 64, 96, 40), (3, 1, 4, 16, 19, 7), (2, 2, 1, 24, 5, 5), (4, 2, 2, 64, 96, 96),
    (2, 1, 18, 32, 40, 33)])  # 18 heads a kv head: two passes of up to 16
def test_decode_attention_equals_masked_softmax(b, k, g, hd, s, written):
    q_BxLxHxhd = _rand((b, 1, k * g, hd), 5)
    keys, values = _rand((b, k, hd, s), 6), _rand((b, k, s, hd), 7)
    valid = np.zeros((b, s), bool)
    valid[:, :written] = True
    valid[0, 1] = False  # a padding slot inside the written span
    valid[-1] = False  # no valid slot at all: the masked softmax weighs every slot alike
    valid = jnp.asarray(valid)
    want = ops.attend(q_BxLxHxhd, keys, values, valid[:, None], keys_transposed=True)[:, :, :, 0]
    got = jax.jit(cpu_kernels.decode_attention, static_argnums=4)(
        q_BxLxHxhd.reshape(b, k, g, hd), keys, values, valid, hd**-0.5)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_rollout_same_with_and_without_the_kernel():
    arch = ModelArch(num_layers=2, hidden=128, num_heads=2, num_kv_heads=1, head_dim=64,
                     ffn=256, vocab=640, tie_embeddings=True, dtype="float32")
    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(3)))
    prompts = np.random.default_rng(0).integers(1, 640, (4, 6)).astype(np.int32)
    lens = np.asarray([6, 3, 5, 1], np.int32)
    settings = SamplingSettings(temperature=0.0, max_new_tokens=10)
    # The kernels decode beside a chunked store (one prompt at a time) too.
    runs = [engine.generate((graphdef, params), (prompts, lens), settings, jax.random.key(0),
                            group_size=2, options=engine.EngineOptions(slots=3, cpu_kernels=m,
                                                                       store_prompts=store))
            for m, store in (("off", 0), ("on", 0), ("on", 1))]
    # auto: the kernels where their register tiles fit (AVX-512), XLA's ops where they spill
    fast = cpu_kernels.register_tiles_fit() is None
    assert backend.choose("auto", params, None) is (backend.CPU_KERNELS if fast else backend.XLA)
    assert backend.choose("on", params, None) is backend.CPU_KERNELS
    assert backend.choose("off", params, None) is backend.XLA
    two = Mesh(np.array(jax.devices()[:2]), ("replica",))
    assert backend.choose("auto", params, two) is backend.XLA
    with pytest.raises(ValueError, match="sharded over 2 devices"):
        backend.choose("on", params, two)
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    assert backend.cpu_kernels_unusable(bf16, None) == "parameters are not all float32"
    for run in runs[1:]:
        np.testing.assert_array_equal(runs[0].tokens_BxL, run.tokens_BxL)
        np.testing.assert_allclose(runs[0].logp_model_BxT, run.logp_model_BxT, atol=1e-4)
    assert runs[2].stats.prefill_rows == 1


AVX2_CHECK = """
import jax, jax.numpy as jnp, numpy as np, platform
from locojax.kernels import cpu
assert cpu.available(), cpu.unavailable_reason()
rng = np.random.default_rng(0)
for m, k, n in ((1, 64, 64), (7, 96, 192), (16, 256, 8192)):
    x = jnp.asarray(rng.standard_normal((m, k), np.float32))
    w = jnp.asarray(rng.standard_normal((k, n), np.float32))
    got = cpu.panel_matmul(x, cpu.pack_panels(w))
    scale = float(jnp.dot(jnp.abs(x), jnp.abs(w)).max())
    np.testing.assert_allclose(got, jnp.dot(x, w, precision="highest"), atol=2e-6 * scale)
print("ok")
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the AVX2 build is x86's")
def test_avx2_register_tile_equals_xla_dot(tmp_path):
    # The 8-float-vector tile (6 rows x 16 columns) an AVX2 CPU builds, built here without
    # AVX-512 whatever this CPU has.
    env = os.environ | {cpu_kernels.ISA_ENV: "avx2", "JAX_PLATFORMS": "cpu",
                        "LOCOJAX_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    library, = (tmp_path / "kernels").glob("cpu_kernels-*.so")
    if shutil.which("objdump"):  # binutils, beside the C++ compiler: no AVX-512 register
        code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True)
        assert "%ymm" in code.stdout and "%zmm" not in code.stdout


def test_disabled_by_environment():
    code = ("from locojax.kernels import cpu as cpu_kernels; "
            "print(cpu_kernels.available(), cpu_kernels.unavailable_reason())")
    env = os.environ | {cpu_kernels.DISABLE_ENV: "0", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False disabled by LOCOJAX_CPU_KERNELS=0"


def test_no_compiler_gives_the_reason(tmp_path):
    code = ("from locojax.kernels import cpu; print(cpu.unavailable_reason())")
    env = os.environ | {"CXX": str(tmp_path / "no-such-c++"), "JAX_PLATFORMS": "cpu",
                        "LOCOJAX_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("compiling cpu_kernels.cc failed"), out


def test_auto_logs_its_choice_once(caplog):
    backend._log_choice.cache_clear()
    with caplog.at_level("INFO", logger=backend.log.name):
        for _ in range(3):
            backend.choose("auto", {"w": jnp.zeros((2,), jnp.bfloat16)}, None)
    assert [r.getMessage() for r in caplog.records] == [
        "rollout: XLA's ops, not the CPU kernels: parameters are not all float32"]


def test_build_warnings_are_shown(tmp_path):
    """A warning in the kernel source reaches the log (no -w), and the kernels still load."""
    source = tmp_path / "cpu_kernels.cc"
    source.write_text(cpu_kernels._SOURCE.read_text() + "\nstatic int unused_fn() { return 1; }\n")
    code = ("import logging, pathlib; from locojax.kernels import cpu; "
            f"cpu._SOURCE = pathlib.Path({str(source)!r}); logging.basicConfig(); "
            "print(cpu.available())")
    env = os.environ | {"JAX_PLATFORMS": "cpu", "LOCOJAX_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "True"
    assert "compiler warnings" in done.stderr and "unused_fn" in done.stderr, done.stderr


def test_model_has_no_kernel_code():
    """The model takes its ops from its caller: no kernel import, flag or stand-in weight."""
    model_dir = Path(ops.__file__).parent
    for path in model_dir.glob("*.py"):
        text = path.read_text()
        for word in ("cpu_kernels", "locojax.kernels", "cpu_attention", "PanelWeight", "Panels"):
            assert word not in text, f"{path.name} mentions {word}"


def test_auto_needs_avx512_for_the_register_tiles():
    assert cpu_kernels.register_tiles_fit("flags : fpu sse2 avx2 fma avx512f avx512bw") is None
    for flags in ("flags : fpu sse2 avx avx2 fma", "Features : fp asimd evtstrm"):
        assert "no AVX-512" in cpu_kernels.register_tiles_fit(flags)

"""What `locojax.aot` reads from a compiled program: loop-multiplied matmul FLOPs, collectives,
the compiler's out-of-memory message."""

import jax
import jax.numpy as jnp
import pytest

from locojax.aot.analysis import collectives, group_size, memory, out_of_memory, received
from locojax.aot.hloflops import causal_block_pairs, matmul_flops


def _scan(x, w_NxDxD):
    return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, w_NxDxD)[0].sum()


def test_matmul_flops_multiply_a_scanned_body_by_its_trips():
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    w = jax.ShapeDtypeStruct((7, 128, 128), jnp.float32)
    compiled = jax.jit(_scan).lower(x, w).compile()
    assert matmul_flops(compiled.as_text()) == 7 * 2 * 64 * 128 * 128
    assert compiled.cost_analysis()["flops"] < 2 * 2 * 64 * 128 * 128  # the body once
    # forward and the input gradient: two matmuls per layer
    grad = jax.jit(jax.grad(_scan)).lower(x, w).compile()
    assert matmul_flops(grad.as_text()) == 2 * 7 * 2 * 64 * 128 * 128
    m = memory(compiled)
    assert m.peak_bytes >= m.argument_bytes > 0


HLO = """\
%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]) parameter(0)
  %ag = bf16[32,16]{1,0} all-gather(bf16[8,16]{1,0} %x), dimensions={0}
  %ars = (f32[8,16]{1,0}, f32[8,16]{1,0}) all-reduce-start(f32[8,16]{1,0} %y), to_apply=%add
}
ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %w = (s32[], f32[8,16]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"28"}}
  %cp = f32[8,16]{1,0} collective-permute(f32[8,16]{1,0} %a), source_target_pairs={{0,1}}
}
"""


def test_collectives_count_loop_bodies_per_iteration():
    got = {c.kind: (c.count, c.bytes) for c in collectives(HLO)}
    assert got == {"all-gather": (28, 28 * 32 * 16 * 2), "all-reduce": (28, 28 * 8 * 16 * 4),
                   "collective-permute": (1, 8 * 16 * 4)}


FUSED = """\
%fused_start (p0: bf16[64,4]) -> bf16[64,16] {
  %p0 = bf16[64,4]{1,0} parameter(0)
  ROOT %ag.1 = bf16[64,16]{1,0} all-gather(%p0), channel_id=7, replica_groups=mesh['a'=4] {'a'}, dimensions={1}
}
%async_collective_fusion.1 (p1: bf16[64,4]) -> bf16[64,16] {
  %p1 = bf16[64,4]{1,0} parameter(0)
  ROOT %ag.2 = bf16[64,16]{1,0} all-gather(%p1), channel_id=7, replica_groups=mesh['a'=4] {'a'}, dimensions={1}, backend_config={"async_collective_fusion_config":{"flag_start":"2","flag_end":"8"}}
}
%async_collective_fusion.2 (p2: bf16[64,4]) -> bf16[64,16] {
  %p2 = bf16[64,4]{1,0} parameter(0)
  ROOT %ag.3 = bf16[64,16]{1,0} all-gather(%p2), channel_id=7, replica_groups=mesh['a'=4] {'a'}, dimensions={1}, backend_config={"async_collective_fusion_config":{"flag_start":"2","flag_end":"8"}}
}
%body (p: (s32[], bf16[64,4])) -> (s32[], bf16[64,4]) {
  %p = (s32[], bf16[64,4]) parameter(0)
  %f0 = bf16[64,16]{1,0} fusion(%x), kind=kCustom, calls=%fused_start
  %f1 = bf16[64,16]{1,0} fusion(%x), kind=kCustom, calls=%async_collective_fusion.1
  %f2 = bf16[64,16]{1,0} fusion(%x), kind=kCustom, calls=%async_collective_fusion.2
  %rs = bf16[16,16]{1,0} reduce-scatter(%z), channel_id=9, dimensions={0}, to_apply=%add
}
ENTRY %main (a: bf16[64,4]) -> bf16[64,4] {
  %w = (s32[], bf16[64,4]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
}
"""


def test_the_copies_of_one_collective_in_async_fusions_count_once():
    """The TPU compiler repeats an all-gather in each async collective fusion it runs through
    (one `channel_id`): one all-gather per loop iteration, not three."""
    got = {c.kind: (c.count, c.bytes, c.received_bytes) for c in collectives(FUSED)}
    # A device receives 3/4 of each gather (groups of 4) and, of a reduce-scatter over every
    # device (no groups named), its whole result.
    assert got == {"all-gather": (3, 3 * 64 * 16 * 2, 3 * 64 * 16 * 2 * 3 // 4),
                   "reduce-scatter": (3, 3 * 16 * 16 * 2, 3 * 16 * 16 * 2)}


@pytest.mark.parametrize(("line", "size"), [
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={1}", 4),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}", 8),
    # Devices in another order than the mesh's (multi-host slices): the group is axis_0's 4.
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, "
     "use_global_device_ids=true", 4),
    ("replica_groups=[2,4]<=[8], dimensions={0}", 4),
    ("replica_groups={{0,1},{2,3}}, to_apply=%add", 2),
    ("source_target_pairs={{0,1}}", None)])
def test_the_group_of_a_collective_is_read_in_each_form(line, size):
    assert group_size(f"%x = f32[8] all-gather(%y), {line}") == size


def test_a_device_receives_its_share_of_each_kind():
    assert received("all-gather", 400, 4) == 300
    assert received("reduce-scatter", 100, 4) == 300  # the other 3 shards of its input
    assert received("all-reduce", 400, 4) == 600
    assert received("all-to-all", 400, 4) == 300
    assert received("collective-permute", 400, 4) == 400


def test_the_compilers_out_of_memory_message_gives_the_bytes():
    err = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
                       "required for HLO temporaries (41.32G) exceeds available HBM (15.75G).")
    oom = out_of_memory("train_step", err)
    assert oom.program == "train_step"
    assert oom.needed_bytes == int(41.32 * 2**30)
    assert oom.available_bytes == int(15.75 * 2**30)
    assert "Ran out of memory" in oom.message
    assert out_of_memory("train_step", RuntimeError("INVALID_ARGUMENT: no")) is None


@pytest.mark.parametrize("text", ["RESOURCE_EXHAUSTED: Used 20.50G of 15.75G hbm. Exceeded "
                                  "hbm capacity by 4.75G."])
def test_other_out_of_memory_wordings(text):
    oom = out_of_memory("rollout_slots", RuntimeError(text))
    assert oom.needed_bytes == int(20.5 * 2**30) and oom.available_bytes == int(15.75 * 2**30)


TPU_LOOP = """\
%cond (p: (s32[], f32[8,16])) -> pred[] {
  %bound = s32[]{:T(128)} constant(28)
  %p = (s32[], f32[8,16]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %bound), direction=LT
}
%body (q: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %q = (s32[], f32[8,16]) parameter(0)
  %x = f32[8,16] get-tuple-element(%q), index=1
  %w = f32[16,16] constant({...})
  %d = f32[8,16] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %b = bf16[48,8,1024,128]{3,2,1,0} parameter(1)
  %s = f32[48,8,1024,1024]{3,2,1,0} parameter(2)
  %c = f32[48,8,1024,128]{3,2,1,0} convolution(%s, %b), window={size=48x8 stride=47x7 lhs_dilate=48x8}, dim_labels=01fb_01io->01bf
  ROOT %t = (s32[], f32[8,16]) tuple(%i, %d)
}
ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16] parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[8,16]) tuple(%z, %a)
  %w = (s32[], f32[8,16]) while(%t), condition=%cond, body=%body
  ROOT %r = f32[8,16] get-tuple-element(%w), index=1
}
"""
"""A TPU-optimised loop: no known_trip_count, its bound in the condition; a batched dot
written as a convolution whose window spans the batch dimensions, each dilated by its size."""


def test_tpu_loops_and_batched_dot_convolutions():
    dot = 2 * 8 * 16 * 16
    batched = 2 * 48 * 8 * 1024 * 128 * 1024  # one tap per batch position: 1024 features
    assert matmul_flops(TPU_LOOP) == 28 * (dot + batched)


SPLASH_LOOP = TPU_LOOP.replace(
    "  ROOT %t = (s32[], f32[8,16]) tuple(%i, %d)\n",
    '  %splash_mha_fwd_segmented_residuals.1 = (bf16[2,16,1024,128]{3,2,1,0}, '
    'f32[2,16,1024,128]{3,2,1,0}) custom-call(%m, %n, %q, %k, %v), '
    'custom_call_target="tpu_custom_call", operand_layout_constraints={s8[1,2,2]{2,1,0}, '
    's8[1,2,2]{2,1,0}, bf16[2,16,1024,128]{3,2,1,0}, bf16[2,8,1024,128]{3,2,1,0}, '
    'bf16[2,8,1024,128]{3,2,1,0}}, frontend_attributes={kernel_metadata={\n'
    '"xprof_metadata":"{\\"block_q\\": 512, \\"block_kv\\": 512, \\"block_q_dq\\": 256}"\n'
    '}}, metadata={op_name="splash"}\n'
    '  %other = f32[8] custom-call(%x), custom_call_target="tpu_custom_call", '
    'backend_config={"custom_call_config":{"body":"AA","cost_estimate":{"flops":"1000",'
    '"transcendentals":"0"}}}\n'
    "  ROOT %t = (s32[], f32[8,16]) tuple(%i, %d)\n")
"""TPU_LOOP's body with a splash attention forward (2 rows, 16 heads, 1,024 tokens, blocks of
512, its metadata on the lines after it) and a kernel that states its cost."""


def test_pallas_kernels_count_their_matmuls():
    assert causal_block_pairs(1024, 512, 512) == 3
    assert causal_block_pairs(1024, 256, 512) == 6  # query blocks 0,1: key block 0; 2,3: both
    assert causal_block_pairs(1024, 1024, 1024) == 1
    dot = 2 * 8 * 16 * 16
    batched = 2 * 48 * 8 * 1024 * 128 * 1024
    splash = 2 * 2 * 2 * 16 * 3 * 512 * 512 * 128  # 2 matmuls, 2 rows, 16 heads, 3 pairs
    assert matmul_flops(SPLASH_LOOP) == 28 * (dot + batched + splash + 1000)

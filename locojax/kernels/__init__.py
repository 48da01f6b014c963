"""Hand-written kernels the rollout engine may run instead of XLA's ops; the model never
imports them (it takes its matmul and attention from its caller: `locojax.model.ops`).

CPU kernels (`cpu.py`, source `cpu_kernels.cc`, XLA FFI calls)
    available() -> bool; unavailable_reason() -> str | None   (first call compiles, ~3 s,
        cached in $LOCOJAX_CACHE_DIR/kernels; compiler warnings are logged;
        LOCOJAX_CPU_KERNELS=0 turns them off)
    pack_panels(W_KxN | W_NxK, transposed=False, out_shape=None) -> Panels   (N/64
        contiguous Kx64 panels, one copy)
    panel_matmul(x_...xK, panels) -> ...x out_shape   rows x panels, shared out over XLA's
        CPU threads (fp32)
    decode_attention(q_BxKxGxhd, keys_BxKxhdxS, values_BxKxSxhd, valid_BxS, scale)
        -> BxKxGxhd: one decode step's masked softmax attention, reading only slots up to
        each row's last valid one

The rollout engine wraps them as a backend (`locojax.rollout.backend`): packs the layer
matrices and the output matrix once per generation, hands the model `ModelOps` whose matmul
takes the panels and whose cached attention runs the decode kernel on one-token steps.
"""

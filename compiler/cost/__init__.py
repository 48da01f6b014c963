"""The cost model: predicted seconds of one RL step, and its fit to measured runs.

    flops        FLOPs and bytes of a decoder from its architecture numbers
    memory       the memory budgets the layout passes size against (training state,
                 activations, rollout weights and KV cache)
    prefill      the rollout prefill's peak per device, buffer by buffer (report-only:
                 `locojax-plan aot=true` holds it against the TPU compiler)
    phases       seconds of each phase (rollout, train, collectives, transfer, dispatch,
                 reward) on one mode's view of the machine
    estimate     `estimate`: the three modes (CO, DA, single controller) of a layout
    roofline     the efficiency a compiled program allows (its roofline fraction)
    fit          fit a hardware entry's cost constants to measured runs (calibration)
    characterize where a single controller's step goes, per model size

The estimate's data types (`CostEstimate`, `ModeCost`, `Assumption`) are plan data and live
in `compiler.plan`; the machine rules (torus shapes, valid chip counts) in `compiler.hardware`.
This package's `__init__` imports nothing, so its modules import each other without a cycle.
"""

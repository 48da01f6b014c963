"""Ahead-of-time compile of the plan's own programs for a given set of devices.

    ExecutionPlan + devices of the whole slice (compile-only TPU devices from
    `jax.experimental.topologies.get_topology_desc(...)`, or CPU devices)
      --slice.slice_hosts--> devices per host (process index, else blocks of the plan's size)
      --runtime.components.build_host(plan, host, devices=, local=, data=False)-->
            trainer host (train mesh over every trainer host's devices) and one rollout host
      --abstract inputs (jax.ShapeDtypeStruct with the plan's shardings; nothing placed)-->
            train_step       train_programs.make_steps(host).train on train_programs.abstract_step_inputs
            rollout_prefill  rollout.engine.compile_programs (prompt store, slots, tensor
            rollout_slots        parallelism, KV dtype: the host's EngineOptions)
            reshard          CO: weights._cast_to per parameter (master shards -> rollout
                                 layout in the compute dtype); LoRA: the trainer's merge
                                 (frozen base + s A B, one program)
      --compile--> ProgramReport per program: memory_analysis, cost_analysis flops,
            collectives of the optimised HLO, beside the plan's estimates (compiler.cost)
      (the compiler's RESOURCE_EXHAUSTED -> ProgramOutOfMemory with needed / available bytes)

`lower_programs(plan, devices, platform)` gives the same programs' StableHLO for a platform
(the CPU text equals what the runtime lowers; 'cuda' lowers without a GPU).

Where it sits: above `single` and `disagg` (it may compile DA's programs), below the glue
rooms (`launch`, `reports`, `config`) and the entry points, which call it (`locojax-plan ...
aot=true`). It never loads libtpu itself and sets no environment: the caller brings the
devices.
"""

from locojax.aot.programs import (
    Collective,
    ProgramOutOfMemory,
    ProgramReport,
    compile_programs,
    lower_programs,
)

__all__ = ["Collective", "ProgramOutOfMemory", "ProgramReport", "compile_programs",
           "lower_programs"]

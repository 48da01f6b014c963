"""The LoCoJAX plan compiler: typed config in, frozen execution plan out. Plain Python, no JAX.

Data flow (each box a plain function in `compiler/passes/`, chained by `compile_plan` in
`compiler.pipeline`; each takes the config sections it reads and the earlier boxes' outputs):

    Config (compiler.config) + DetectedTopology (mesh=auto only)
      |
      v
    checkpoint_model   model=hf: numbers from model.checkpoint's config.json;  -> Config
                       any other entry: checked against it (compiler.model_entry)
    ranges             every field's stated range, finite floats, relations  (raises only)
    param_table        each parameter's name, shape, logical axes (once)   -> ParamInfo table
    resolve_topology   hosts, devices per host, chips, TPU torus shape     -> Topology
    resolve_placement  CO / DA; auto compiles each candidate placement      -> PlacementSummary
                       below and keeps the fastest predicted one
    lengths            prompt, response and row tokens                     -> Lengths
    partition          rollout hosts and trainer hosts                      -> Partitions
    shard              train mesh (data, fsdp), rollout mesh (replica,      -> Sharding
                       tensor), rule tables, a PartitionSpec per parameter
    batch              prompt ranges per rollout host, rows, micro-batches  -> BatchPlan
    transfer           weight slices and rounds trainer -> rollout hosts    -> TransferPlan
    schedule           ordered phases and overlaps of one step              -> StepSchedule
    _estimate_cost     compiler.cost.estimate on the layout's numbers       -> CostEstimate
    validate           the plan's own invariants (a failure is a bug)
      |
      v
    ExecutionPlan (compiler.plan) --plan_to_json / plan_from_json--> JSON (identity round trip)

A configuration the passes reject raises `PlanError(key, value, rule, rule_id)`, one line
naming the config key (`compiler.errors.KEYS`) and the rule (`compiler.errors.RULES`).
"""

from compiler.errors import PlanError
from compiler.jsonio import from_data, plan_from_json, plan_to_json, to_data
from compiler.pipeline import compile_plan
from compiler.plan import DetectedTopology, ExecutionPlan

__all__ = [
    "DetectedTopology",
    "ExecutionPlan",
    "PlanError",
    "compile_plan",
    "from_data",
    "plan_from_json",
    "plan_to_json",
    "to_data",
]

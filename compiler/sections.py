"""The schema sections the runtime's settings are built from: workload, algorithm, sampling
(and the model entry's RoPE scaling, which `locojax.model.rope` reads).

Part of the structured-config schema (`compiler.config.Config` holds them; Hydra validates
`conf/workload/*.yaml`, `conf/algorithm/*.yaml` and `sampling.*` against them), kept in a module
of their own so that the pure runtime code may import it (the import rules allow it, never
`compiler.config`): its settings dataclasses (`locojax.data.WorkloadSettings`,
`locojax.train.OptimizerSettings`, `locojax.rollout.sampler.SamplingSettings`, ...) take their
defaults from these sections' defaults, so each default is written once, here. Plain frozen
dataclasses; no Hydra, no OmegaConf. Field docstrings and `Range:` rules as in
`compiler.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from compiler.vocab import (
    DType,
    DynamicSampling,
    KernelSwitch,
    LoraWarmup,
    LossAggregation,
    LrSchedule,
    OldLogprobs,
    Overlong,
    PolicyLoss,
    RatioLevel,
    Remat,
    RewardKind,
    RolloutCorrection,
    RolloutSchedule,
    RopeKind,
)


@dataclass(frozen=True)
class ArithConfig:
    """Difficulty knobs of the generated arithmetic workload."""

    min_operand: int = 0
    """Smallest operand. Range: >= 0."""
    max_operand: int = 9
    """Largest operand. Range: >= workload.arith.min_operand; enough for >= 5 distinct problems."""
    terms: int = 2
    """Operands per problem. Range: >= 1."""
    ops: str = "+"
    """Operators drawn from, e.g. `+-` or `+-*`. Range: non-empty, characters of +-*."""
    train_size: int = 100_000
    """Problems generated for training (from `run.seed`). Range: >= 1."""
    eval_size: int = 256
    """Held-out problems for evaluation (a disjoint seed stream). Range: >= 1."""


@dataclass(frozen=True)
class ReasoningGymConfig:
    """A task of the `reasoning-gym` package as the workload's rows (`workload=reasoning_gym`,
    the `reasoning-gym` extra): generated procedurally, scored by the task's own
    `score_answer` (docs/tasks.md)."""

    task: str = ""
    """The task's name in `reasoning_gym.factory.DATASETS` (`basic_arithmetic`, `chain_sum`,
    `leg_counting`, ...); empty: the workload is not a reasoning-gym one. Range: empty unless
    workload.reward=python (the task's score_answer is a reward function)."""
    size: int = 10_000
    """Problems generated for training (from `seed`). Range: >= 1."""
    eval_size: int = 200
    """Held-out problems for evaluation (from `seed` + 1). Range: >= 1."""
    seed: int = 0
    """The generator's seed for the training problems. Range: >= 0."""


@dataclass(frozen=True)
class WorkloadConfig:
    """A prompt source, its template and reward (`conf/workload/*.yaml`)."""

    name: str = "arith"
    """Short name, as in `workload=<name>`."""
    dataset: str = ""
    """Hub data set name for `datasets` (empty for generated workloads)."""
    dataset_config: str | None = None
    """Hub data set configuration (GSM8K: `main`)."""
    data_dir: str | None = None
    """Local directory (or jsonl file) used instead of the hub, e.g. `../shared/data/gsm8k`."""
    train_split: str = "train"
    """Split (or jsonl file stem) the prompts come from."""
    eval_split: str = "test"
    """Split held out for evaluation."""
    question_field: str = "question"
    """Row field holding the problem text."""
    answer_field: str = "answer"
    """Row field holding the reference solution or answer."""
    messages_field: str | None = None
    """Row field holding the prompt already in chat form (a list of {role, content}
    messages), used instead of `question_field`: the messages go through the chat template;
    a final assistant message is left out of the prompt and is the reference answer when the
    row has no `answer_field` (docs/tasks.md)."""
    data_files: dict[str, str] = field(default_factory=dict)
    """Split (`train`, `eval`) -> a local JSONL, JSON, Parquet or CSV file, read through
    `datasets` (instead of `dataset` and `data_dir`)."""
    eval_fraction: float = 0.0
    """With no `eval` file: the share of train rows held out for evaluation (the same rows on
    every run). Range: in [0, 1)."""
    max_row_bytes: int = 1_048_576
    """A data row larger than this (its JSON text in UTF-8) is skipped and counted as a
    malformed one is: one oversized row takes no host's memory and no tokenizer's time.
    Range: >= 1."""
    prompt_template: str = "{question}"
    """Python format string applied to the question before the chat template.
    Range: a template using only {question}."""
    chat_template: bool = True
    """Wrap prompts in the Qwen3 chat template. Range: false with model.tokenizer=char or
    ascii (they have no chat tokens; episodes of several turns take the plain turn
    format)."""
    enable_thinking: bool = False
    """With the chat template: let Qwen3 think first (`<think>...</think>`, counted in
    `max_response_len`); off writes an empty think block, so the answer starts at once."""
    reward: RewardKind = RewardKind.gsm8k
    """How completions are scored."""
    format_reward: float = 0.0
    """Reward of a well-formed wrong answer (a right one scores 1). Default 0, as verl's
    GSM8K scorer (format_score=0.0), and 0 in the gsm8k and numina_cot workloads: rewards are
    normalised per group, so in an all-wrong group [0.1, 0, ..., 0.1] gets the advantages of
    [1, 0, ..., 1] and a formatted wrong answer is pushed like a right one. The arith
    workload keeps 0.1: its model starts from scratch, where the format is the first thing
    to learn. Range: in [0, 1]."""
    reward_timeout_s: float = 1.0
    """Time limit per row of a reward call (a math-verify check, or a reward function on its
    worker's rows); a timeout scores 0. Range: in (0, 86400]."""
    reward_memory_mb: int = 0
    """Address-space limit (RLIMIT_AS) of each worker process that runs the user's code
    (reward functions, environments, tools), in MiB; 0: none. An allocation past it raises
    MemoryError in that code, which fails its call (counted like any error) instead of
    taking the host's memory; the kernel's OOM killer also picks a worker before the trainer.
    A worker with sympy or math-verify loaded needs ~1,000. Range: in [0, 16777216]; 0 (no
    limit) or >= 256 (a Python worker's own start takes ~150)."""
    reward_max_fail_steps: int = 3
    """A reward function that fails (raises or times out) on some row in each of this many
    consecutive training steps (a step fails when any of its batches does: dynamic
    sampling's, an evaluation's) stops the run in one line, exit 2, as one that fails on
    every row of one batch does. Isolated failures score 0 and are counted
    (`reward_fail/<name>`) and warned. Range: >= 1."""
    reward_fns: dict[str, str] = field(default_factory=dict)
    """With `reward=python`: name -> `<path/to/file.py>:<function>` or `<module>:<function>`
    (docs/tasks.md). Two flat maps rather than one of {fn, weight}: OmegaConf 2.3 cannot add
    an entry to a dict of dataclasses from the command line (`+workload.reward_fns.a.fn=`).
    Range: empty unless workload.reward=python (a built-in reward kind scores alone)."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """Name -> weight of that function in the reward (the weighted sum); 1 when not given."""
    correct: str | None = None
    """With `reward=python`: the one of `reward_fns` that decides correctness (`accuracy`,
    pass@1, pass@k, maj@k): a completion is correct when that function returned a number
    >= `correct_threshold` for it. With neither this nor `correct_threshold` correctness is
    unknown and those metrics are left out (docs/tasks.md); the built-in kinds judge it
    themselves. Range: None, or a name in workload.reward_fns with workload.reward=python."""
    correct_threshold: float | None = None
    """With `correct`: the threshold on that function's value (None: 1.0). Without it: a
    completion is correct when its reward (the weighted sum over `reward_fns`) is >= this.
    Range: None or a finite number; None unless workload.reward=python."""
    prompts_per_step: int = 24
    """Prompts sampled per optimizer batch, over all rollout hosts. Range: >= 1."""
    group_size: int = 8
    """Completions G per prompt; advantages are normalised within a group.
    Range: >= 2 (GRPO: with one completion every advantage is 0 and nothing is learnt)."""
    max_prompt_len: int = 32
    """Longest prompt in tokens; longer prompts are skipped and counted. Range: >= 1."""
    max_response_len: int = 16
    """Longest completion in tokens. Range: >= 1."""
    eval_prompts: int = 64
    """Held-out prompts scored (pass@1, greedy) at each evaluation. Range: >= 1."""
    env: str = ""
    """An environment class of the user's, `<path/to/file.py>:<Class>` or `<module>:<Class>`:
    one instance per episode, `Class(row)`, stepped with each reply (docs/multiturn.md); or
    another package's environment, `verifiers:<taskset>` or `openenv:<module>:<Class>`
    (`compiler.vocab.EnvHub`), which also brings the rows. Empty: none (with `tools`, a reply
    without a tool call ends the episode)."""
    env_args: dict[str, str] = field(default_factory=dict)
    """With a hub's `env`: its settings, name -> value (verifiers: its taskset config's
    fields; openenv: the Environment's constructor arguments), e.g.
    `+workload.env_args.game=Wordle-v0`. Range: empty unless workload.env names a hub
    (verifiers:..., openenv:...)."""
    tools: dict[str, str] = field(default_factory=dict)
    """Tool name -> `<path/to/file.py>:<function>` or `<module>:<function>`: functions with
    type hints and a docstring the model may call (`+workload.tools.add=tools.py:add`)."""
    max_turns: int = 1
    """The model's turns per episode (1 without `env` and `tools`: one prompt, one reply).
    Range: >= 1; >= 2 when workload.tools is set (a tool's result is read in the turn after
    its call)."""
    max_episode_len: int = 0
    """Tokens of an episode after its prompt, replies and environment messages together: the
    train rows' response length with `env` or `tools` (0: max_turns x max_response_len +
    (max_turns - 1) x max_prompt_len). Range: >= 0."""
    env_timeout_s: float = 5.0
    """Time limit on one environment call (`reset`, `step`); past it the episode ends,
    counted in `env_errors`. Range: in (0, 86400]."""
    tool_timeout_s: float = 5.0
    """Time limit on one tool call; past it the model reads an error message, counted in
    `tool_errors`. Range: in (0, 86400]."""
    max_tool_calls: int = 16
    """Tool calls run from one reply, in order; the model reads one error message for the
    rest, which are not run, counted in `tool_calls_dropped`. Range: >= 1."""
    max_tool_result_tokens: int = 1024
    """Tokens of one tool result the model reads: a longer one is cut there and ends with a
    marker saying so, counted in `tool_results_cut` (its worker sends at most 16 characters
    a token). Range: >= 1."""
    env_step_s: float = 0.0
    """Host seconds one environment or tool step is expected to take (the cost model's turn
    term: each host's, or the single controller's driver's, share of every turn's steps;
    `env_s` in metrics.jsonl measures it). Range: >= 0."""
    arith: ArithConfig = field(default_factory=ArithConfig)
    """Generator settings, used by the `arith` workload only."""
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
    """The reasoning-gym task, used when its `task` is set (`workload=reasoning_gym`)."""


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""Block matmuls LoRA may adapt: attention q/k/v/o and the SwiGLU gate/up/down projections."""


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (`algorithm.lora.*`): W = W_base + (alpha / rank) A B, only A and B
    trained (in `model.param_dtype`, with their AdamW moments); the base is frozen in
    `model.dtype` and is also the KL reference."""

    rank: int = 0
    """Adapter rank r (0: off, full fine-tuning). Range: >= 0."""
    alpha: float = 32.0
    """Scale numerator: the update is (alpha / rank) A B. Range: > 0."""
    targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """Block matmuls adapted, any of q, k, v, o, gate, up, down (default: all).
    Range: non-empty, each one of q, k, v, o, gate, up, down, no repeats."""
    dropout: float = 0.0
    """Dropout on the adapters' input: not implemented, so only 0 is accepted. Range: in [0, 0]."""
    learning_rate: float = 0.0
    """Peak learning rate of the adapters in RL (0: LORA_RATE_MULTIPLE x
    algorithm.learning_rate; the compiled plan holds the rate used). Range: >= 0."""
    warmup: LoraWarmup = LoraWarmup.adapters
    """What the supervised warm-up (`algorithm.sft_warmup_steps`) trains: `adapters` keeps
    LoRA's memory (for a pretrained base), `full` trains the whole model first, which then
    is the frozen base and KL reference (for a from-scratch model, e.g. arith_co). `full`
    with placement=disaggregated is refused (its rollout hosts read the base themselves)."""


LORA_RATE_MULTIPLE = 3.0
"""LoRA's default rate over full fine-tuning's: best of 1x, 3x and 6x on arith_co at ranks 16
and 64 (docs/lora.md); Schulman et al.'s "LoRA Without Regret" (2025) finds ~10x for RL on
pretrained models, so set algorithm.lora.learning_rate for those from your own scan."""


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO hyper-parameters (`conf/algorithm/*.yaml`)."""

    name: str = "grpo"
    """Algorithm family. Range: one of grpo."""
    learning_rate: float = 1e-6
    """Peak learning rate (0 takes steps that change nothing: a check that training from a
    checkpoint keeps it bit for bit). Range: >= 0."""
    lr_schedule: LrSchedule = LrSchedule.constant
    """Shape after warm-up."""
    warmup_steps: int = 0
    """Linear warm-up steps. Range: >= 0."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of the peak. Range: in [0, 1]."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay. Range: >= 0."""
    adam_b1: float = 0.9
    """AdamW first-moment decay. Range: in [0, 1)."""
    adam_b2: float = 0.999
    """AdamW second-moment decay. Range: in [0, 1)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off). Range: >= 0."""
    clip_eps: float = 0.2
    """Lower clip of the importance ratio, 1 - eps (PPO's 0.2). With ratio_level=sequence the
    configuration's default is GSPO's far smaller range, clip_eps=3e-4 and clip_eps_high=4e-4
    (Zheng et al. 2025, arXiv:2507.18071, section 5.1; verl's GSPO recipe the same), and
    loss_aggregation sequence_mean, unless they are set (conf/algorithm/grpo.yaml).
    Range: in (0, 1)."""
    clip_eps_high: float = 0.2
    """Upper clip of the importance ratio, 1 + eps (DAPO's clip-higher when larger: 0.28 in
    DAPO, Yu et al. 2025, arXiv:2503.14476, which the gsm8k_* and numina_* experiments use).
    Range: > 0."""
    loss: PolicyLoss = PolicyLoss.ppo_clip
    """The per-token policy objective: `ppo_clip` (PPO's clipped surrogate: GRPO, DAPO, GSPO)
    or `cispo` (MiniMax-M1's clipped importance weight, held constant: every token keeps its
    gradient). Both use clip_eps / clip_eps_high and ratio_level; only ppo_clip takes
    dual_clip (docs/fine-tuning.md, "Policy losses")."""
    ratio_level: RatioLevel = RatioLevel.token
    """token: one ratio per token; sequence: GSPO's length-normalised sequence ratio
    exp(mean over the response of log pi - log pi_old), clipped per sequence (see clip_eps
    for its clip range)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen reference (0: no reference model).
    Range: >= 0."""
    loss_aggregation: LossAggregation = LossAggregation.token_mean
    """How token losses are reduced."""
    optimizer_steps_per_batch: int = 1
    """Optimizer steps taken on each rollout batch (mini-batches). 1 takes the only update at
    pi = pi_old, where no clip binds (and skips the pi_old forward: it is the current policy);
    the gsm8k_* and numina_* experiments take 2 (verl's GSM8K recipe takes 4: 1,024 prompts,
    mini-batch 256; DAPO 16: 512 prompts, mini-batch 32), the most that the 6 rows a device
    holds at 256 v7x chips split into. With more than one, each process's rows are shuffled
    over the mini-batches every step, a permutation drawn from (run.seed, step, process).
    Range: >= 1."""
    normalize_advantage_std: bool = True
    """Divide group-centred rewards by the group's sample std (ddof 1, as TRL and verl:
    torch.std's default; Dr. GRPO turns this off)."""
    sft_warmup_steps: int = 0
    """Supervised steps on reference solutions before RL (for from-scratch models).
    Range: >= 0."""
    sft_learning_rate: float = 3e-3
    """Learning rate of the supervised warm-up. Range: > 0."""
    remat: Remat = Remat.block
    """Activation checkpointing of the decoder blocks in training (`block` or `none`)."""
    old_logprobs: OldLogprobs = OldLogprobs.recompute
    """pi_old of the ratio: `recompute` (the trainer's own forward, same numerics as the
    update) or `rollout` (the engine's log-probs; saves one forward per batch)."""
    rollout_correction: RolloutCorrection = RolloutCorrection.tis
    """Correction of each token's policy-gradient term for the policy that sampled it, by
    w = pi_old / pi_rollout (pi_rollout the log-prob the sampler drew with, top-k/top-p
    included; pi_old the trainer's recompute; no gradient through the weight): `tis`
    min(w, cap) per token (TIS, Yao et al. 2025, verl's `tis_imp_ratio_cap`), `mis` w where
    it lies in [low, cap], else 0 (IcePop), `seq_tis` / `seq_mis` the same on the product of
    w over each sequence (Liu, Li et al. 2025; verl's `rollout_is=sequence`) with their own
    bounds (`rollout_correction_seq_cap`, `_seq_low`), `none` off. With old_logprobs=recompute this is
    decoupled PPO (AReaL, Fu et al. 2025, arXiv:2505.24298): the clip trusts the proximal
    pi_old, the weight corrects for the engine's numerics in every mode and also for the lag
    of stale samples in DA, which is why `tis` is the default: a DA plan with
    max_staleness > 0, old_logprobs=recompute and rollout_correction=none is refused."""
    rollout_correction_cap: float = 2.0
    """Upper bound of a token's w: the clamp of `tis` (verl's 2), the mask's upper edge of
    `mis`. Range: > 0."""
    rollout_correction_low: float = 0.0
    """Lower edge of the `mis` mask (0: 1 / rollout_correction_cap, verl's default).
    Range: >= 0."""
    rollout_correction_seq_cap: float = 2.0
    """Upper bound of a sequence's product of w: the clamp of `seq_tis`, the mask's upper
    edge of `seq_mis` (verl's `rollout_is_threshold`, 2). Range: > 0."""
    rollout_correction_seq_low: float = 0.0
    """Lower edge of the `seq_mis` mask (0: none, Seq-MIS's rho * 1{rho <= C}).
    Range: >= 0."""
    mask_env_failures: bool = True
    """Multi-turn: an episode ended by an environment or worker failure (env.reset/step
    raised or timed out, its worker died or restarted) gets zero loss weight (counted as
    `masked_env_failures`): its partial last reply is infrastructure noise, not behaviour.
    Its reward still counts in its group's baseline."""
    overlong: Overlong = Overlong.keep
    """Multi-turn: what an episode cut by `max_episode_len` or `max_turns` trains on: `keep`
    (as any episode), `mask` (zero loss weight, counted as `masked_overlong`; DAPO's overlong
    filtering) or `penalty` (DAPO's soft overlong punishment added to its reward, over the
    last `overlong_buffer` tokens of `max_episode_len`). Range: keep unless the workload's
    episodes are turns (workload.env or workload.tools)."""
    overlong_buffer: int = 0
    """With overlong=penalty: DAPO's L_cache, the tokens before an episode's limit over which
    the penalty falls from 0 to -1 (0: only a cut episode, -1). Range: >= 0; < the
    episode's tokens (workload.max_episode_len, when set)."""
    dual_clip: float = 0.0
    """Dual-clip constant c: for a negative advantage A the surrogate is at least c * A; 0 is
    off. Range: 0 or > 1; 0 unless algorithm.loss takes a dual clip (ppo_clip)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters instead of full fine-tuning (`rank` 0: off)."""
    dynamic_sampling: DynamicSampling = DynamicSampling.off
    """`filter`: DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476; verl
    `algorithm.filter_groups`, NeMo-RL `use_dynamic_sampling`). Groups whose rewards all agree
    are dropped; each rollout host samples more of its own prompts (the next batches of a second
    stream for run.seed, host-local) until it has its share of informative groups or has
    sampled `max_sample_batches` batches. The train batch keeps its planned shape: the first
    informative groups in sampling order, and when the bound is hit, zero-std groups as
    zero-weight rows (loss mask cleared) in the places left. `off`: every group trains. Both
    log `frac_zero_std` (TRL's `frac_reward_zero_std`) and `groups_sampled`."""
    max_sample_batches: int = 10
    """With dynamic_sampling=filter: the most batches (the host's prompts x group_size each,
    the first included) a rollout host samples in one step (verl's `max_num_gen_batches` and
    NeMo-RL's `dynamic_sampling_max_gen_batches` default to 10; they stop the run there, we
    pad with zero-weight rows). Range: >= 1."""
    zero_std_share: float = 0.0
    """The cost model's share of groups whose rewards all agree, read from a run's
    `frac_zero_std` (metrics.jsonl); with dynamic_sampling=filter it charges the expected extra
    batches on the busiest rollout host. Read by the cost model only; 0 charges none.
    Range: in [0, 1]."""

    @property
    def old_forward(self) -> bool:
        """Whether the trainer runs a pi_old forward before a batch's updates: only for
        old_logprobs=recompute with several updates per batch. With one update, pi_old is the
        policy being updated, exactly (its parameters are the trainer's current ones, whatever
        the samples' lag), so the loss takes the stop-gradient of its own log-probs instead."""
        return self.old_logprobs == OldLogprobs.recompute and self.optimizer_steps_per_batch > 1

    @property
    def rl_learning_rate(self) -> float:
        """The RL phase's peak rate: the adapters' (`lora.learning_rate`, 0: LORA_RATE_MULTIPLE
        x learning_rate) with LoRA, else learning_rate."""
        if self.lora.rank == 0:
            return self.learning_rate
        return self.lora.learning_rate or LORA_RATE_MULTIPLE * self.learning_rate

    def with_rates(self) -> AlgorithmConfig:
        """This configuration with the adapters' rate written out (what the plan holds)."""
        if self.lora.rank == 0 or self.lora.learning_rate:
            return self
        return replace(self, lora=replace(self.lora, learning_rate=self.rl_learning_rate))

    @property
    def rollout_logp(self) -> bool:
        """Whether the trainer takes the sampler's log-probs: the rollout correction's
        denominator (none for rollout_correction=none)."""
        return self.rollout_correction != RolloutCorrection.none


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled (`sampling.*`)."""

    temperature: float = 1.0
    """Softmax temperature; 0 is greedy. Range: >= 0."""
    top_p: float = 1.0
    """Nucleus mass kept (1: off). Range: in (0, 1]."""
    top_k: int = 0
    """Tokens kept by probability rank (0: off). Range: >= 0."""
    max_new_tokens: int = 0
    """Completion length cap (0: the workload's `max_response_len`). Range: >= 0."""
    slots: int = 0
    """Rows the rollout keeps resident per replica (0: as many as its KV budget allows, the
    plan's `batch.slots`); more than fit is a plan error. Range: >= 0."""
    prompt_store: int = 0
    """Prompts whose KV the rollout keeps at once per replica (0: the plan's
    `batch.prompt_store_rows`, every prompt when that leaves room for the slots); a smaller
    store is refilled by prefilling the next prompts inside the slot loop. Must divide the
    replica's prompts. Range: >= 0."""
    schedule: RolloutSchedule = RolloutSchedule.refill
    """refill: a finished row's slot takes the next row at once; static: waves. Multi-turn
    episodes alike: refill runs each episode's turn as soon as its environment answered
    and gives an ended episode's slot to the next (`decode_chunk` steps between the host's
    looks); static runs them in waves, turn by turn."""
    decode_chunk: int = 16
    """Multi-turn with schedule=refill: decode steps a call runs before the host hands the
    replies that ended to the environments and feeds the answered episodes. Range: >= 1."""
    decode_quorum: float = 0.5
    """Multi-turn with schedule=refill: with no reply being decoded, a chunk starts once
    this share of the episodes in slots (ready or waiting for their environment) are ready,
    or when no answer is pending: 0 starts at the first answer (a chunk costs what a full
    one does, however few slots run), 1 waits for every answer (turn by turn). Range: in
    [0, 1]."""
    cpu_kernels: KernelSwitch = KernelSwitch.auto
    """The rollout's CPU kernels: auto | on | off."""
    kv_dtype: DType | None = None
    """KV-cache dtype (null: the model dtype)."""
    env_overlap: bool = False
    """Multi-turn with schedule=static: a replica runs two waves of its episodes at once,
    each with its own KV caches, so one wave decodes while the other's environments and
    tools run (the plan's `batch.waves_in_flight`; its waves at most half the replica's
    episodes, both waves' caches counted). Needs two episodes a replica; one-reply runs
    ignore it."""


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling of a model entry: Hugging Face's `rope_scaling` (`rope_parameters`) dict.

    Fields a kind does not read keep their defaults; the default entry is unscaled RoPE.
    `locojax.model.rope.rope_frequencies` turns it into the frequency table.
    """

    kind: RopeKind = RopeKind.default
    """Which rescaling (`rope_type`)."""
    factor: float = 1.0
    """Context extension factor s: linear and llama3 divide (low) frequencies by it, yarn
    interpolates towards inv_freq / s. Range: >= 1."""
    original_max_position: int = 0
    """Context length the model was pretrained at (`original_max_position_embeddings`): llama3's
    wavelength bands and yarn's correction range; 0 where the kind does not read it.
    Range: >= 0; >= 1 when model.rope_scaling.kind is llama3 or yarn."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_position / low_freq_factor are divided by
    `factor`. Range: > 0."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_position / high_freq_factor are kept.
    Range: > 0; > model.rope_scaling.low_freq_factor."""
    beta_fast: float = 32.0
    """yarn: dims turning more than beta_fast times over original_max_position are kept
    (extrapolated). Range: > 0; > model.rope_scaling.beta_slow."""
    beta_slow: float = 1.0
    """yarn: dims turning fewer than beta_slow times over original_max_position are divided by
    `factor` (interpolated). Range: > 0."""
    attention_factor: float | None = None
    """yarn: the factor cos and sin are multiplied by (attention logits by its square); None:
    0.1 ln(factor) + 1 for factor > 1, else 1 (YaRN's mscale). Range: None or > 0."""

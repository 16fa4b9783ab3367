"""Configuration of the training stages: one frozen, validated dataclass per component.

One YAML file configures every stage (``cuda-agent train all --config train.yaml``)::

    environment: {name: cuda, tasks: data/synth-h100/tasks.parquet}
    model: {path: /models/base, critic: separate, precision: bf16-mixed}
    agent: {max_turns: 150}                      # AgentConfig (docs/agent.md)
    pool: {backend: local}                       # PoolConfig (docs/scale.md): warm-up scoring
    device: cuda                                 # + build/verify/timing/... (docs/environment.md)
    warmup: {steps: 50, rollout: {samples_per_task: 4}}
    rft: {epochs: 2}
    value: {steps: 20}
    ppo: {steps: 200}

Every field is documented under it; docs/train.md lists them all. Loading is strict: an unknown
key or a wrong type is an error naming its path (``ppo.algorithm.clip_hi``) and the valid keys.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class TrainConfigError(ValueError):
    """A training configuration value is invalid; the message names the field and what is allowed."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise TrainConfigError(message)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (one per trained model: actor, critic)."""

    lr: float = 3e-6
    """Peak learning rate (paper: actor 3e-6, critic 6e-6). 0 freezes the model's weights."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's moment decay rates."""
    eps: float = 1e-8
    """AdamW's epsilon."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to ``lr``."""
    schedule: str = "constant"
    """After warm-up: ``constant``, ``linear`` or ``cosine`` decay to ``lr * min_lr_ratio`` at the last step."""
    min_lr_ratio: float = 0.0
    """The learning rate at the last step, as a fraction of ``lr`` (``linear`` and ``cosine``)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""

    def __post_init__(self) -> None:
        _require(self.lr >= 0, f"lr must be >= 0, got {self.lr}")
        _require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                 f"betas must be two numbers in [0, 1), got {self.betas}")
        _require(self.eps > 0, f"eps must be > 0, got {self.eps}")
        _require(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        _require(self.schedule in SCHEDULES, f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        _require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _require(self.max_grad_norm >= 0, f"max_grad_norm must be >= 0, got {self.max_grad_norm}")


SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are sampled from the actor (through the agent loop's ``hf`` policy)."""

    tasks_per_step: int = 8
    """Tasks drawn per step (in a seeded order that resumes exactly)."""
    samples_per_task: int = 4
    """Episodes per task per step."""
    temperature: float = 1.0
    """Sampling temperature; the PPO log-probabilities use the same one. Must be > 0 (PPO needs a
    stochastic policy)."""
    top_p: float = 1.0
    """Nucleus sampling; below 1 the samples are off-policy for the loss, so keep 1 for PPO."""
    max_new_tokens: int = 4096
    """Tokens per assistant turn (warm-up: the whole solution)."""
    max_batch: int = 32
    """Most sequences generated together in one batch."""
    concurrency: int = 32
    """Multi-turn: episodes in flight at once (their turns are batched together)."""
    evaluation_slots: int = 1
    """Multi-turn: evaluations (./build, ./verify, ./profile, final scoring) running at once over
    all episodes; one per GPU on CUDA."""

    def __post_init__(self) -> None:
        for name in ("tasks_per_step", "samples_per_task", "max_new_tokens", "max_batch", "concurrency",
                     "evaluation_slots"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _require(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        _require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.samples_per_task


@dataclass(frozen=True)
class CheckpointConfig:
    """When full training state is saved (model, optimisers, schedulers, RNG, data position)."""

    every_steps: int = 10
    """Save after every this many steps (and always at the end or on a time limit)."""
    keep_last: int = 2
    """Checkpoints kept; older ones are deleted."""

    def __post_init__(self) -> None:
        _require(self.every_steps >= 1, f"every_steps must be >= 1, got {self.every_steps}")
        _require(self.keep_last >= 1, f"keep_last must be >= 1, got {self.keep_last}")


@dataclass(frozen=True)
class PPOAlgorithmConfig:
    """Token-level PPO with GAE (paper: gamma 1, lambda 0.95, clip 0.2 low / 0.28 high)."""

    gamma: float = 1.0
    """Discount per policy token (tool output between turns does not count)."""
    lam: float = 0.95
    """GAE's lambda."""
    clip_low: float = 0.2
    """The ratio is clipped below at ``1 - clip_low``."""
    clip_high: float = 0.28
    """... and above at ``1 + clip_high`` (a wider upper clip keeps exploration alive)."""
    value_clip: float = 0.0
    """Clip the value prediction to ``old ± value_clip`` in the value loss; 0: unclipped."""
    value_coef: float = 1.0
    """Weight of the value loss when the critic is a head on the actor's trunk (one backward pass)."""
    kl_coef: float = 0.0
    """Weight of a KL penalty to the starting policy in the actor loss; 0 loads no reference model."""
    kl_estimator: str = "k3"
    """``k1`` (log-ratio) or ``k3`` (the low-variance, always non-negative estimator)."""
    epochs: int = 2
    """Passes over each step's rollouts. With more than one pass (or minibatch) the policy moves
    away from the one that sampled, the ratio leaves 1 and the clip acts (``actor/clip_fraction``)."""
    minibatches: int = 4
    """Optimizer steps per pass (the rollouts are split into this many shuffled minibatches)."""
    micro_batch_tokens: int = 16384
    """Gradient accumulation: a minibatch runs in micro-batches of at most this many (padded) tokens."""
    normalize_advantages: bool = True
    """Whiten advantages over the step's policy tokens."""

    def __post_init__(self) -> None:
        _require(0 <= self.gamma <= 1, f"gamma must be in [0, 1], got {self.gamma}")
        _require(0 <= self.lam <= 1, f"lam must be in [0, 1], got {self.lam}")
        _require(0 <= self.clip_low < 1, f"clip_low must be in [0, 1), got {self.clip_low}")
        _require(self.clip_high >= 0, f"clip_high must be >= 0, got {self.clip_high}")
        _require(self.value_clip >= 0, f"value_clip must be >= 0, got {self.value_clip}")
        _require(self.value_coef >= 0, f"value_coef must be >= 0, got {self.value_coef}")
        _require(self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}")
        _require(self.kl_estimator in KL_ESTIMATORS,
                 f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        for name in ("epochs", "minibatches"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _require(self.micro_batch_tokens >= 64, f"micro_batch_tokens must be >= 64, got {self.micro_batch_tokens}")


KL_ESTIMATORS = ("k1", "k3")


@dataclass(frozen=True)
class LoRAConfig:
    """Optional LoRA adapters (peft) instead of full fine-tuning."""

    rank: int = 0
    """Adapter rank; 0 trains all weights."""
    alpha: float = 16.0
    """LoRA's scaling numerator (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Names of the linear layers that get adapters (those the model lacks are skipped)."""
    last_layers: int = 0
    """Adapt only the last N transformer blocks (0: all). The backward pass then stops at the lowest
    adapted block: a step on a 5,875-token episode of SmolLM2-135M on 2 CPU cores takes 28 s with
    the last 2 of its 30 blocks, 88 s with all."""

    def __post_init__(self) -> None:
        _require(self.rank >= 0, f"rank must be >= 0, got {self.rank}")
        _require(self.last_layers >= 0, f"last_layers must be >= 0, got {self.last_layers}")
        _require(self.alpha > 0, f"alpha must be > 0, got {self.alpha}")
        _require(0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}")
        _require(bool(self.target_modules), "target_modules must name at least one module")


CRITIC_KINDS = ("separate", "shared")
PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16")


@dataclass(frozen=True)
class ModelConfig:
    """The actor and the critic."""

    path: Path | None = None
    """The starting actor: a transformers model folder with a tokenizer that has a chat template
    (``cuda-agent train init-model`` makes a random one). Later stages take the previous
    stage's ``actor/`` instead."""
    critic: str = "separate"
    """``separate``: a value model of its own (a backbone and a linear value head);
    ``shared``: a value head on the actor's last hidden state."""
    critic_path: Path | None = None
    """Backbone of a separate critic when the value stage creates it (default: the actor it receives)."""
    precision: str = "auto"
    """``fp32``; ``bf16-mixed`` (float32 weights and optimiser, bfloat16 autocast: the GPU
    default); ``bf16`` (bfloat16 weights: for LoRA on a model too large for float32);
    ``auto``: ``bf16-mixed`` on CUDA, ``fp32`` on CPU."""
    device: str = "auto"
    """``cpu``, ``cuda`` or ``cuda:<n>``; ``auto``: ``cuda`` when a GPU is visible."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (long sequences in less memory)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (``rank: 0`` trains every weight)."""

    def __post_init__(self) -> None:
        for name in ("path", "critic_path"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        _require(self.critic in CRITIC_KINDS, f"critic must be one of {CRITIC_KINDS}, got {self.critic!r}")
        _require(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        _require(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
                 f"device must be auto, cpu, cuda or cuda:<n>, got {self.device!r}")


@dataclass(frozen=True)
class KeypadConfig:
    """The synthetic ``keypad`` environment (a sanity check that training learns; no GPU, no compiler)."""

    tasks: int = 8
    """Number of tasks (locks)."""
    codes: tuple[str, ...] = ("7",)
    """Task ``i`` opens with key ``codes[i % len(codes)]`` (stated in the task)."""
    keys: str = "0123456789"
    """The keys the ``press`` tool accepts."""
    max_turns: int = 3
    """Presses (turns) before the episode ends."""

    def __post_init__(self) -> None:
        _require(self.tasks >= 1, f"tasks must be >= 1, got {self.tasks}")
        _require(self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}")
        _require(bool(self.codes) and all(code in self.keys and len(code) == 1 for code in self.codes),
                 f"codes must be single keys from {self.keys!r}, got {self.codes}")


@dataclass(frozen=True)
class EnvironmentConfig:
    """What the agent is trained on."""

    name: str = "cuda"
    """An environment from ``cuda_agent.train.environments.ENVIRONMENTS``: ``cuda`` (kernel tasks
    scored by the trusted evaluator) or ``keypad`` (synthetic)."""
    tasks: Path | None = None
    """``cuda``: a dataset (``.parquet``/``.jsonl``), a KernelBench folder or a problem file."""
    task_limit: int = 0
    """Use only the first N tasks; 0: all."""
    keypad: KeypadConfig = field(default_factory=KeypadConfig)
    """Settings of the ``keypad`` environment."""

    def __post_init__(self) -> None:
        if self.tasks is not None:
            object.__setattr__(self, "tasks", Path(self.tasks))
        _require(self.task_limit >= 0, f"task_limit must be >= 0, got {self.task_limit}")


@dataclass(frozen=True)
class PPOConfig:
    """Multi-turn agentic PPO (``cuda-agent train ppo``): episodes through the agent loop, GAE over
    the policy's tokens (tool output masked), clipped token-level policy loss, value loss."""

    steps: int = 200
    """Rollout-and-update steps."""
    seed: int = 0
    """Seeds Python, NumPy and torch when the stage starts (a resumed run restores the saved generators instead)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How episodes are sampled."""
    algorithm: PPOAlgorithmConfig = field(default_factory=PPOAlgorithmConfig)
    """GAE and the losses."""
    actor_optim: OptimConfig = field(default_factory=OptimConfig)
    """The actor's optimiser (paper: lr 3e-6)."""
    critic_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=6e-6))
    """The critic's optimiser (paper: lr 6e-6)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When full training state is saved."""
    tensorboard: bool = True
    """Also write metrics as TensorBoard events (when ``tensorboard`` is installed)."""

    def __post_init__(self) -> None:
        _require(self.steps >= 1, f"steps must be >= 1, got {self.steps}")


@dataclass(frozen=True)
class WarmupConfig(PPOConfig):
    """Single-turn PPO warm-up (``cuda-agent train warmup``): the prompt is the task, the response
    one complete solution file, scored by the trusted evaluator. Same fields as ``ppo``."""

    steps: int = 50
    """Rollout-and-update steps."""


@dataclass(frozen=True)
class RFTFilterConfig:
    """Which sampled trajectories rejection fine-tuning keeps."""

    min_reward: int = 1
    """Keep trajectories whose final reward is at least this (paper: reward > 0, i.e. 1: correct;
    2: also faster than eager)."""
    max_repeats: int = 3
    """A loop: the same tool calls (names and arguments) in this many consecutive turns, or the
    same non-empty assistant text this many times in a row. Looping trajectories are dropped."""
    drop_invalid_calls: bool = True
    """Drop trajectories with an invalid tool call: an unknown tool, arguments that are not a JSON
    object matching the tool's schema, or a ``<tool_call>`` block that does not parse."""

    def __post_init__(self) -> None:
        _require(self.min_reward in (-1, 1, 2, 3), f"min_reward must be -1, 1, 2 or 3, got {self.min_reward}")
        _require(self.max_repeats >= 2, f"max_repeats must be >= 2, got {self.max_repeats}")


@dataclass(frozen=True)
class RFTConfig:
    """Rejection fine-tuning (``cuda-agent train rft``): sample trajectories with the warm-up actor
    (and/or read given ones), keep the good ones, fine-tune on their assistant tokens."""

    sample: bool = True
    """Sample ``rollout.tasks_per_step x samples_per_task`` episodes per round with the actor."""
    sample_rounds: int = 1
    """Rounds of sampling (each draws the next tasks of the seeded order)."""
    trajectories: tuple[Path, ...] = ()
    """More trajectory files (``cuda-agent-trajectory/1`` JSONL) to filter and train on."""
    filter: RFTFilterConfig = field(default_factory=RFTFilterConfig)
    """Which trajectories are kept."""
    min_kept: int = 1
    """Fewer kept trajectories than this is an error (nothing worth fine-tuning on)."""
    epochs: int = 2
    """Passes over the kept trajectories."""
    batch_size: int = 16
    """Sequences per optimizer step."""
    micro_batch_tokens: int = 16384
    """Gradient accumulation: a batch runs in micro-batches of at most this many (padded) tokens."""
    max_seq_tokens: int = 32768
    """A kept trajectory with a training sequence longer than this is dropped whole (counted as
    ``too_long`` in ``filter.json``): cutting it would remove its ending, which carries the outcome."""
    seed: int = 0
    """Seeds Python, NumPy and torch when the stage starts (a resumed run restores the saved generators instead)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How episodes are sampled."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """The actor's optimiser for fine-tuning."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When full training state is saved."""
    tensorboard: bool = True
    """Also write metrics as TensorBoard events (when ``tensorboard`` is installed)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trajectories", tuple(Path(p) for p in self.trajectories))
        _require(self.sample or bool(self.trajectories), "sample is false and no trajectories are given: "
                                                         "nothing to train on")
        for name in ("sample_rounds", "epochs", "batch_size"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _require(self.min_kept >= 0, f"min_kept must be >= 0, got {self.min_kept}")
        _require(self.micro_batch_tokens >= 64, f"micro_batch_tokens must be >= 64, got {self.micro_batch_tokens}")
        _require(self.max_seq_tokens >= 64, f"max_seq_tokens must be >= 64, got {self.max_seq_tokens}")


@dataclass(frozen=True)
class ValueConfig:
    """Value pre-training (``cuda-agent train value``): the critic regresses GAE returns on the RFT
    actor's trajectories; the actor is frozen."""

    steps: int = 20
    """Critic update steps (one batch of episodes each)."""
    seed: int = 0
    """Seeds Python, NumPy and torch when the stage starts (a resumed run restores the saved generators instead)."""
    trajectories: tuple[Path, ...] = ()
    """Train on these trajectory files (every step takes the next batch of episodes) instead of
    sampling with the actor."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How episodes are sampled."""
    algorithm: PPOAlgorithmConfig = field(default_factory=PPOAlgorithmConfig)
    """``gamma``, ``lam``, ``value_clip``, ``epochs``, ``minibatches`` and ``micro_batch_tokens`` apply."""
    critic_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=6e-6))
    """The critic's optimiser (paper: lr 6e-6)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When full training state is saved."""
    tensorboard: bool = True
    """Also write metrics as TensorBoard events (when ``tensorboard`` is installed)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trajectories", tuple(Path(p) for p in self.trajectories))
        _require(self.steps >= 1, f"steps must be >= 1, got {self.steps}")


STAGES = ("warmup", "rft", "value", "ppo")
"""The stages in the order ``train all`` runs them."""

EVAL_KEYS = ("device", "build", "verify", "timing", "limits", "guards", "sandbox", "cache_dir", "scratch_dir")
"""Top-level YAML keys that configure the trusted evaluator (``EvalConfig``, docs/environment.md)."""


@dataclass(frozen=True)
class TrainConfig:
    """The whole YAML file: the environment, the model and one section per stage. The evaluator's
    sections (``device``, ``build``, ...), ``agent`` and ``pool`` are kept as given and built by
    the components that use them."""

    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    rft: RFTConfig = field(default_factory=RFTConfig)
    value: ValueConfig = field(default_factory=ValueConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    agent: dict[str, Any] = field(default_factory=dict)
    """The ``AgentConfig`` section (multi-turn episodes; docs/agent.md)."""
    pool: dict[str, Any] = field(default_factory=dict)
    """The ``PoolConfig`` section (warm-up scoring; docs/scale.md)."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """The evaluator's sections (``device``, ``build``, ``verify``, ``timing``, ...)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "config") -> TrainConfig:
        """Build from a parsed YAML mapping.

        Raises:
            TrainConfigError: naming the key path of the first problem and what is allowed.
        """
        _require(isinstance(data, dict), f"{origin}: must be a mapping of sections")
        sections = {f.name for f in dataclasses.fields(cls)} - {"evaluation"}
        unknown = set(data) - sections - set(EVAL_KEYS)
        _require(not unknown, f"{origin}: unknown keys {sorted(unknown)}; valid: {sorted(sections | set(EVAL_KEYS))}")
        values: dict[str, Any] = {"evaluation": {k: v for k, v in data.items() if k in EVAL_KEYS}}
        for name in ("agent", "pool"):
            if name in data:
                _require(isinstance(data[name], dict), f"{origin}.{name}: must be a mapping")
                values[name] = dict(data[name])
        from cuda_agent.train.config_loading import from_mapping

        hints = typing.get_type_hints(cls)
        for name in sections - {"agent", "pool"}:
            if name in data:
                values[name] = from_mapping(hints[name], data[name], f"{origin}.{name}")
        return cls(**values)

    def stage(self, name: str) -> WarmupConfig | RFTConfig | ValueConfig | PPOConfig:
        _require(name in STAGES, f"unknown stage {name!r}; valid: {', '.join(STAGES)}")
        return getattr(self, name)

"""The step loop every stage runs: resume from the newest checkpoint, run steps, log metrics,
checkpoint, stop cleanly at a step or a deadline. Also the pieces whose state a checkpoint holds:
the task order (:class:`TaskSampler`), optimisers and schedules.

    loop = TrainingLoop(out_dir, steps=100, checkpoint=CheckpointConfig(), tensorboard=True,
                        state={"actor": ModuleState(actor), "actor_optim": optimizer, "tasks": sampler})
    outcome = loop.run(lambda step: {"loss": ...})
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from cuda_agent.train.checkpoint import (
    Stateful, load_latest, load_trainable_state, save_checkpoint, set_rng_state, trainable_state,
)
from cuda_agent.train.config import CheckpointConfig, OptimConfig
from cuda_agent.train.metrics import MetricsLog

logger = logging.getLogger(__name__)


class TaskSampler:
    """Task indices in a seeded random order, one epoch after another (every task once per epoch)."""

    def __init__(self, count: int, seed: int) -> None:
        if count < 1:
            raise ValueError("no tasks to sample from")
        self.count, self.seed = count, seed
        self.epoch = self.position = 0

    def _order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.count, generator=generator).tolist()

    def take(self, k: int) -> list[int]:
        """The next ``k`` task indices (continuing into the next epoch as needed)."""
        taken: list[int] = []
        while len(taken) < k:
            chunk = self._order(self.epoch)[self.position: self.position + k - len(taken)]
            taken.extend(chunk)
            self.position += len(chunk)
            if self.position >= self.count:
                self.epoch, self.position = self.epoch + 1, 0
        return taken

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "count": self.count, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if (state["count"], state["seed"]) != (self.count, self.seed):
            raise ValueError(f"checkpoint was taken over {state['count']} tasks with seed {state['seed']}, "
                             f"this run has {self.count} with seed {self.seed}")
        self.epoch, self.position = state["epoch"], state["position"]


class ModuleState:
    """A module's trainable parameters as a checkpoint entry."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.module)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        load_trainable_state(self.module, state)


class PeakMemory:
    """The peak GPU memory of one step: reset when the step starts, read when it ends (nothing on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def metrics(self) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        return {"gpu/peak_memory_gb": torch.cuda.max_memory_allocated(self.device) / 2**30}


def make_optimizer(parameters: Iterable[torch.nn.Parameter], config: OptimConfig) -> torch.optim.AdamW | None:
    """AdamW over the parameters that require grad; ``None`` when there are none."""
    trainable = [p for p in parameters if p.requires_grad]
    if not trainable:
        return None
    return torch.optim.AdamW(trainable, lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig,
                   total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then ``config.schedule`` down to ``min_lr_ratio`` at ``total_steps``."""

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
        shape = 1.0 - progress if config.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_step(optimizer: torch.optim.Optimizer | None, scheduler: Any, max_grad_norm: float) -> float:
    """Clip, step and zero one optimiser; returns the gradient norm before clipping (0 if none)."""
    if optimizer is None:
        return 0.0
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    limit = max_grad_norm if max_grad_norm > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(parameters, limit)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return float(norm)


@dataclass(frozen=True)
class LoopOutcome:
    """How a run of the loop ended."""

    completed: bool
    """All steps are done."""
    step: int
    """The last step done (and checkpointed)."""
    stopped: str | None = None
    """``until_step`` or ``time_limit`` when the loop stopped before the end."""
    resumed_from: int = 0


class TrainingLoop:
    """Runs ``step_fn(step) -> metrics`` for steps ``1..steps`` with checkpoints and resume.

    Args:
        stage_dir: the stage's output folder (``checkpoints/``, ``metrics.jsonl``, ``tensorboard/``).
        state: everything a checkpoint holds besides RNGs, by name (modules as :class:`ModuleState`).
        on_step: called after each step with its metrics (a progress bar).
    """

    def __init__(self, stage_dir: Path, steps: int, checkpoint: CheckpointConfig, tensorboard: bool,
                 state: dict[str, Stateful], on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self.stage_dir, self.steps, self.checkpoint = stage_dir, steps, checkpoint
        self.tensorboard, self.state, self.on_step = tensorboard, state, on_step

    def resume(self) -> int:
        """Load the newest checkpoint, if any; returns the step it was taken after (0: none)."""
        saved = load_latest(self.stage_dir)
        if saved is None:
            return 0
        unknown = sorted(set(saved["state"]) ^ set(self.state))
        if unknown:
            raise ValueError(f"{self.stage_dir}: the checkpoint does not match this stage (entries {unknown})")
        for name, entry in self.state.items():
            entry.load_state_dict(saved["state"][name])
        set_rng_state(saved["rng"])
        logger.info("%s: resumed after step %d", self.stage_dir, saved["step"])
        return int(saved["step"])

    def save(self, step: int) -> None:
        save_checkpoint(self.stage_dir, step, {"state": {n: e.state_dict() for n, e in self.state.items()}},
                        self.checkpoint.keep_last)

    def run(self, step_fn: Callable[[int], dict[str, float]], until_step: int | None = None,
            deadline: float | None = None) -> LoopOutcome:
        """Run the remaining steps.

        Args:
            until_step: stop (with a checkpoint) after this step, as if interrupted there.
            deadline: a ``time.monotonic()`` value; stop (with a checkpoint) after the step that passes it.
        """
        start = self.resume()
        metrics = MetricsLog(self.stage_dir, self.tensorboard, start)
        try:
            for step in range(start + 1, self.steps + 1):
                started = time.monotonic()
                values = dict(step_fn(step))
                values["step_s"] = time.monotonic() - started
                metrics.log(step, values)
                if self.on_step is not None:
                    self.on_step(step, values)
                stopped = "until_step" if until_step is not None and step >= until_step else \
                    "time_limit" if deadline is not None and time.monotonic() >= deadline else None
                if step % self.checkpoint.every_steps == 0 or step == self.steps or stopped:
                    self.save(step)
                if stopped and step < self.steps:
                    return LoopOutcome(False, step, stopped, start)
        finally:
            metrics.close()
        return LoopOutcome(True, self.steps, None, start)

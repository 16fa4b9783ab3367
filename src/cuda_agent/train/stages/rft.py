"""``train rft``: rejection fine-tuning. Sample episodes with the warm-up actor (and/or read
recorded ones), keep those the filter accepts (:mod:`cuda_agent.train.filters`), and fine-tune
the actor on their assistant tokens.

Files: ``sampled.jsonl`` (every sampled episode; written once sampling is complete, so a rerun
either reuses it or samples again), ``kept.jsonl`` and ``filter.json`` (what the filter kept and
why it dropped the rest), then the usual ``metrics.jsonl``, ``checkpoints/`` and ``actor/``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cuda_agent.agent.trajectory import Trajectory, append_trajectory, read_trajectories
from cuda_agent.train.checkpoint import seed_everything
from cuda_agent.train.config import RFTConfig
from cuda_agent.train.environments import make_environment
from cuda_agent.train.filters import FilterReport, filter_trajectories
from cuda_agent.train.metrics import read_metrics
from cuda_agent.train.models import ModelSet
from cuda_agent.train.rollout import collect_episodes, training_policy
from cuda_agent.train.sequences import TokenRow, trajectory_rows
from cuda_agent.train.sft import SFTLearner
from cuda_agent.train.stages.common import (
    ACTOR_DIR, ADAPTER_DIR, StageContext, StageError, StageRecord, StageResult, stage_settings,
)
from cuda_agent.train.trainer import TaskSampler, TrainingLoop

SAMPLED_FILE = "sampled.jsonl"
KEPT_FILE = "kept.jsonl"
FILTER_FILE = "filter.json"


class NothingToTrain(StageError):
    """The filter kept fewer trajectories than ``rft.min_kept``."""


def sample_episodes(context: StageContext, models: ModelSet, section: RFTConfig) -> list[Trajectory]:
    """``sample_rounds`` rounds of ``tasks_per_step x samples_per_task`` episodes with the actor."""
    environment = make_environment(context.config, section.rollout.evaluation_slots)
    try:
        policy = training_policy(models, section.rollout)
        sampler = TaskSampler(len(environment.tasks), section.seed)
        episodes: list[Trajectory] = []
        for number in range(section.sample_rounds):
            jobs = [(environment.tasks[i], sample) for i in sampler.take(section.rollout.tasks_per_step)
                    for sample in range(section.rollout.samples_per_task)]
            episodes.extend(collect_episodes(environment, policy, jobs, section.rollout.concurrency,
                                             f"rft{number}").trajectories)
            if context.on_step is not None:
                context.on_step("rft sampling", number + 1, section.sample_rounds, {})
        return episodes
    finally:
        environment.close()


def _write_jsonl(path: Path, trajectories: list[Trajectory]) -> None:
    """Write all of ``trajectories`` to ``path`` at once (a crash leaves the old file or none)."""
    partial = path.with_name(path.name + ".tmp")
    partial.unlink(missing_ok=True)
    partial.touch()
    for trajectory in trajectories:
        append_trajectory(partial, trajectory)
    partial.replace(path)


def gather_trajectories(context: StageContext, record: StageRecord, models: ModelSet,
                        section: RFTConfig) -> list[Trajectory]:
    """Sampled episodes (sampled now, or reused from an earlier run of this stage) and given ones."""
    sampled_path = context.out_dir / SAMPLED_FILE
    if section.sample and not record.record.get("sampled"):
        _write_jsonl(sampled_path, sample_episodes(context, models, section))
        record.write(sampled=True)
    trajectories = list(read_trajectories(sampled_path)) if section.sample else []
    for path in section.trajectories:
        trajectories.extend(read_trajectories(path))
    return trajectories


def training_rows(kept: list[Trajectory], tokenizer: Any, max_seq_tokens: int,
                  report: FilterReport) -> tuple[list[Trajectory], list[TokenRow]]:
    """The kept trajectories that fit and their rows with policy tokens. A trajectory with a row
    longer than ``max_seq_tokens`` is dropped whole (``too_long`` in ``report``): cutting the row
    would remove its ending, the turns that reached the outcome being imitated."""
    fitting: list[Trajectory] = []
    rows: list[TokenRow] = []
    for trajectory in kept:
        own = trajectory_rows(trajectory, len(fitting), tokenizer)
        if any(len(row.ids) > max_seq_tokens for row in own):
            report.drop("too_long")
            continue
        fitting.append(trajectory)
        rows.extend(row for row in own if row.policy_tokens > 0 and len(row.ids) > 1)
    return fitting, rows


def run_rft(context: StageContext) -> StageResult:
    """Rejection fine-tuning of the previous stage's actor (or ``model.path``); hands on ``actor/``."""
    config, section = context.config, context.config.rft
    actor = context.previous.actor if context.previous else config.model.path
    if actor is None:
        raise StageError("rft needs an actor: --from the warmup folder, or model.path")
    record = StageRecord(context, "rft", stage_settings(config, "rft"))
    if record.completed:
        return StageResult("rft", context.out_dir, True, 0, 0, summary=record.record["summary"], already_done=True)
    record.write(status="running")
    seed_everything(section.seed)
    models = ModelSet(config.model, actor, None, train_actor=True)
    kept, report = filter_trajectories(gather_trajectories(context, record, models, section), section.filter)
    kept, rows = training_rows(kept, models.tokenizer, section.max_seq_tokens, report)
    _write_jsonl(context.out_dir / KEPT_FILE, kept)
    (context.out_dir / FILTER_FILE).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    if len(kept) < section.min_kept:
        record.write(status="stopped", summary={"filter": report.to_dict()})
        raise NothingToTrain(f"rft: the filter kept {len(kept)} of {report.seen} trajectories, fewer than "
                             f"rft.min_kept={section.min_kept} (dropped: {report.to_dict()['dropped']}); add "
                             "recorded trajectories (rft.trajectories), sample more, or relax rft.filter, then run again "
                             f"with another --out folder ({context.out_dir} keeps the settings it was started with)")
    steps = max(1, math.ceil(section.epochs * len(rows) / section.batch_size))
    learner = SFTLearner(models, section.optim, steps, section.micro_batch_tokens)
    order = TaskSampler(len(rows), section.seed)
    on_step = (lambda n, m: context.on_step("rft", n, steps, m)) if context.on_step else None
    loop = TrainingLoop(context.out_dir, steps, section.checkpoint, section.tensorboard,
                        {**learner.state(), "rows": order}, on_step)
    outcome = loop.run(lambda step: learner.step([rows[i] for i in order.take(section.batch_size)]),
                       context.until_step, context.deadline)
    if not outcome.completed:
        record.write(status="stopped")
        return StageResult("rft", context.out_dir, False, outcome.step, steps, outcome.stopped)
    models.save_actor(context.out_dir / ACTOR_DIR, context.out_dir / ADAPTER_DIR)
    history = read_metrics(context.out_dir)
    summary = {"filter": report.to_dict(), "rows": len(rows), "steps": steps,
               "last_step": history[-1] if history else {}}
    record.finish(context.out_dir / ACTOR_DIR, None, summary)
    return StageResult("rft", context.out_dir, True, steps, steps, summary=summary)

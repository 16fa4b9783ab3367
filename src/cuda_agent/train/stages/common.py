"""What every stage shares: its output folder and ``stage.json``, the hand-over to the next
stage, and the context a stage runs in.

A stage's folder::

    stage.json        format, stage, status (running | stopped | completed), the configuration it
                      runs with, its input folder, the actor and critic it hands on, a summary
    actor/, critic/   the models it trained (a stage that trains no actor points at its input's)
    adapter/          with LoRA: the actor's adapters alone (PEFT), on top of the stage's starting actor
    metrics.jsonl     one line per step; tensorboard/ beside it
    checkpoints/      the newest full training states (resume)

Running a stage again in the same folder resumes it; with another configuration or input it is
refused (naming what differs); a completed stage is not run again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from cuda_agent.train.config import TrainConfig
from cuda_agent.train.config_loading import to_jsonable

STAGE_FILE = "stage.json"
STAGE_FORMAT = "cuda-agent-train-stage/1"
ACTOR_DIR = "actor"
ADAPTER_DIR = "adapter"
CRITIC_DIR = "critic"


class StageError(ValueError):
    """A stage cannot run as asked (bad input folder, changed configuration); exit status 2."""


@dataclass(frozen=True)
class StageOutput:
    """A completed stage's hand-over: the actor and, if it has one, the critic."""

    folder: Path
    stage: str
    actor: Path
    critic: Path | None

    @classmethod
    def read(cls, folder: Path) -> StageOutput:
        """Raises:
            StageError: ``folder`` is not a completed stage's output.
        """
        record = read_record(folder)
        if record is None:
            raise StageError(f"{folder}: not a training stage's output (no {STAGE_FILE})")
        if record.get("status") != "completed":
            raise StageError(f"{folder}: stage {record.get('stage')} is {record.get('status')}, not completed; "
                             "run it again to finish it")
        return cls(folder, record["stage"], Path(record["actor"]), Path(record["critic"]) if record["critic"] else None)


def read_record(folder: Path) -> dict[str, Any] | None:
    path = folder / STAGE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(f"{path}: unreadable ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != STAGE_FORMAT:
        raise StageError(f"{path}: not a {STAGE_FORMAT} record")
    return record


@dataclass
class StageContext:
    """Everything a stage runs with.

    Args:
        config: the whole configuration (the stage reads its own section, ``model`` and ``environment``).
        out_dir: the stage's folder.
        previous: the hand-over of the stage before (None for warm-up, or to start from ``model.path``).
        on_step: ``(stage, step, steps, metrics)`` after each step (the CLI's progress bar).
        until_step: stop (resumable) after this step.
        deadline: a ``time.monotonic()`` value; stop (resumable) after the step that passes it.
    """

    config: TrainConfig
    out_dir: Path
    previous: StageOutput | None = None
    on_step: Callable[[str, int, int, dict[str, float]], None] | None = None
    until_step: int | None = None
    deadline: float | None = None


@dataclass(frozen=True)
class StageResult:
    stage: str
    out_dir: Path
    completed: bool
    step: int
    steps: int
    stopped: str | None = None
    """``until_step`` or ``time_limit`` when it stopped early (run again to resume)."""
    summary: dict[str, Any] = field(default_factory=dict)
    already_done: bool = False


class StageRecord:
    """``stage.json`` of a running stage: created, checked against an earlier run, finished."""

    def __init__(self, context: StageContext, stage: str, settings: dict[str, Any]) -> None:
        self.path = context.out_dir / STAGE_FILE
        self.stage = stage
        self.identity = {"stage": stage, "input": str(context.previous.folder.resolve()) if context.previous else None,
                         "settings": to_jsonable(settings)}
        existing = read_record(context.out_dir)
        if existing is not None:
            before = {"stage": existing["stage"], "input": existing["input"], "settings": existing["settings"]}
            if before != self.identity:
                changed = ", ".join(_differences(before, self.identity)) or "?"
                raise StageError(f"{context.out_dir}: holds a run started with other settings ({changed}); "
                                 "use another output folder")
        self.record: dict[str, Any] = existing or {"format": STAGE_FORMAT, **self.identity, "status": "running",
                                                    "actor": None, "critic": None, "summary": {},
                                                    "started_at": _now(), "finished_at": None}
        self._started = time.monotonic()

    @property
    def completed(self) -> bool:
        return self.record["status"] == "completed"

    def write(self, **changes: Any) -> None:
        self.record.update(changes)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(to_jsonable(self.record), indent=2, allow_nan=False, default=str) + "\n")
        partial.replace(self.path)

    def finish(self, actor: Path, critic: Path | None, summary: dict[str, Any]) -> None:
        self.write(status="completed", actor=str(actor.resolve()), critic=str(critic.resolve()) if critic else None,
                   summary=summary, finished_at=_now())


def stage_settings(config: TrainConfig, stage: str) -> dict[str, Any]:
    """The parts of the configuration a stage's results depend on (what a resume must not change)."""
    return {"stage": config.stage(stage), "model": config.model, "environment": config.environment,
            "agent": config.agent, "evaluation": config.evaluation}


def _differences(before: Any, after: Any, path: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(set(before) | set(after))
        return [d for k in keys for d in _differences(before.get(k), after.get(k), f"{path}.{k}" if path else k)]
    return [] if before == after else [path or "value"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()

"""Training metrics: one JSON line per step in ``metrics.jsonl`` and, when ``tensorboard`` is
installed, TensorBoard events under ``tensorboard/``.

On resume the lines after the checkpoint's step are dropped (those steps run again), so the file
always describes one consistent run.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def read_metrics(stage_dir: Path) -> list[dict[str, Any]]:
    path = stage_dir / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLog:
    """Appends step metrics; ``resume_step`` drops what was logged after it."""

    def __init__(self, stage_dir: Path, tensorboard: bool, resume_step: int = 0) -> None:
        self.path = stage_dir / METRICS_FILE
        kept = [row for row in read_metrics(stage_dir) if row.get("step", 0) <= resume_step]
        stage_dir.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        self._writer = _tensorboard_writer(stage_dir / TENSORBOARD_DIR, resume_step) if tensorboard else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as out:
            out.write(json.dumps(row) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if self._writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _plain(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _tensorboard_writer(folder: Path, resume_step: int) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("tensorboard is not installed: metrics go to %s only", METRICS_FILE)
        return None
    return SummaryWriter(str(folder), purge_step=resume_step + 1 if resume_step else None)

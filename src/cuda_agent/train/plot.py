"""Learning curves of a training run (``cuda-agent train plot RUN_DIR``): one PNG drawn from the
stages' ``metrics.jsonl``, the stages one after another on a shared step axis.

RUN_DIR is one stage's folder or a ``train all`` folder (its ``warmup``, ``rft``, ``value`` and
``ppo`` sub-folders, those that exist). matplotlib is optional (the ``train`` extra) and imported
only here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cuda_agent.train.config import STAGES
from cuda_agent.train.metrics import METRICS_FILE, read_metrics

PANELS = (("reward/mean", "mean reward"), ("actor/clip_fraction", "clip fraction"),
          ("actor/approx_kl", "approx. KL (old to new)"), ("critic/loss", "critic loss"), ("sft/loss", "SFT loss"))
"""The metrics drawn, one panel each (a panel no stage logged is left out)."""
PLOT_FILE = "learning_curve.png"


class PlotError(ValueError):
    """Nothing to plot, or matplotlib is missing; the message says what to do."""


def stage_histories(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each stage's metric rows, in stage order.

    Raises:
        PlotError: ``run_dir`` holds no metrics.
    """
    if (run_dir / METRICS_FILE).is_file():
        histories = {run_dir.name: read_metrics(run_dir)}
    else:
        histories = {name: read_metrics(run_dir / name) for name in STAGES if (run_dir / name / METRICS_FILE).is_file()}
    histories = {name: rows for name, rows in histories.items() if rows}
    if not histories:
        raise PlotError(f"{run_dir}: no {METRICS_FILE} (give a stage's folder or a 'train all' folder)")
    return histories


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw the learning curves of ``run_dir`` into ``out`` (default ``run_dir/learning_curve.png``).

    Raises:
        PlotError: no metrics, or matplotlib is not installed.
    """
    histories = stage_histories(run_dir)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'cuda-agent[train]' (or pip install matplotlib)") from None
    panels = [(key, title) for key, title in PANELS if any(_finite(row.get(key)) for rows in histories.values()
                                                           for row in rows)]
    if not panels:
        raise PlotError(f"{run_dir}: the metrics hold none of {[key for key, _ in PANELS]}")
    figure, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels)), sharex=True, squeeze=False)
    offset = 0
    for name, rows in histories.items():
        steps = [offset + row["step"] for row in rows]
        for (key, _), axis in zip(panels, axes[:, 0]):
            points = [(step, row[key]) for step, row in zip(steps, rows) if _finite(row.get(key))]
            if points:
                axis.plot(*zip(*points), marker="." if len(points) < 60 else None, label=name, color=_colour(name))
        offset = steps[-1]
        if len(histories) > 1:
            for axis in axes[:, 0]:
                axis.axvline(offset + 0.5, color="grey", linewidth=0.5)
    for (key, title), axis in zip(panels, axes[:, 0]):
        axis.set_ylabel(title)
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize="small")
    axes[0, 0].set_title(f"{run_dir.name}: learning curves")
    axes[-1, 0].set_xlabel("step (stages in order)")
    figure.tight_layout()
    out = out or run_dir / PLOT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def _colour(stage: str) -> str | None:
    """One colour per stage, the same in every panel (a stage missing from a panel shifts no other)."""
    return f"C{STAGES.index(stage)}" if stage in STAGES else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)

"""Learning curves of a training run (``cuda-agent train plot RUN_DIR``): one PNG drawn from the
stages' ``metrics.jsonl``, a column per stage on its own step axis (on one shared axis, RFT's 400
steps left warm-up, value and PPO 3 % of the width), a row per metric on one value axis.

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
    figure = draw(histories, run_dir.name)
    out = out or run_dir / PLOT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def draw(histories: dict[str, list[dict[str, Any]]], title: str) -> Any:
    """The figure of ``histories`` (stage -> metric rows): a row of panels per metric any stage
    logged, sharing its value axis; a column per stage, with its own step axis.

    Raises:
        PlotError: no stage logged any of :data:`PANELS`.
    """
    import matplotlib.pyplot as plt

    panels = [(key, name) for key, name in PANELS if any(_finite(row.get(key)) for rows in histories.values()
                                                         for row in rows)]
    if not panels:
        raise PlotError(f"{title}: the metrics hold none of {[key for key, _ in PANELS]}")
    figure, axes = plt.subplots(len(panels), len(histories), figsize=(1.2 + 3.2 * len(histories), 2.4 * len(panels)),
                                sharex="col", sharey="row", squeeze=False)
    for column, (stage, rows) in enumerate(histories.items()):
        for (key, name), axis in zip(panels, axes[:, column]):
            points = [(row["step"], row[key]) for row in rows if _finite(row.get(key))]
            if points:
                axis.plot(*zip(*points), marker="." if len(points) < 60 else None, color=_colour(stage))
            else:
                axis.text(0.5, 0.5, "not logged", transform=axis.transAxes, ha="center", va="center", color="grey")
            axis.grid(alpha=0.3)
            if column == 0:
                axis.set_ylabel(name)
        axes[0, column].set_title(f"{stage} ({len(rows)} steps)")
        axes[-1, column].set_xlabel("step")
    figure.suptitle(f"{title}: learning curves")
    figure.tight_layout()
    return figure


def _colour(stage: str) -> str | None:
    """One colour per stage, the same in every panel (a stage missing from a panel shifts no other)."""
    return f"C{STAGES.index(stage)}" if stage in STAGES else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)

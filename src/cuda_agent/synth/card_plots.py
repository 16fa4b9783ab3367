"""The data card's histograms as PNG files (matplotlib, an optional dependency).

Two figures: tasks per number of fused operators, and eager time per task on a log axis (the
filter's window spans two decades).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

OPS_PLOT = "ops_per_task.png"
EAGER_PLOT = "eager_ms.png"
INSTALL_MATPLOTLIB = "pip install matplotlib (or 'cuda-agent[train]', which includes it)"


def write_plots(directory: Path, ops_per_task: Mapping[int, int], eager_ms: Sequence[float],
                window_ms: Sequence[float] | None) -> dict[str, str]:
    """Write the histograms into ``directory``.

    Returns:
        ``{"ops_per_task": file name, "eager_ms": file name}`` (the eager plot only when some task
        has a time).

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"the data card's histograms need matplotlib: {INSTALL_MATPLOTLIB}") from None
    written = {}
    figure, axes = plt.subplots(figsize=(5, 3))
    axes.bar([str(count) for count in ops_per_task], list(ops_per_task.values()), color="#4477aa")
    axes.set(xlabel="fused operators per task", ylabel="tasks")
    figure.tight_layout()
    figure.savefig(directory / OPS_PLOT, dpi=120)
    plt.close(figure)
    written["ops_per_task"] = OPS_PLOT
    if eager_ms:
        low, high = min(eager_ms), max(eager_ms)
        if window_ms:  # the whole window, so that a set's place in it shows
            low, high = min(low, window_ms[0] or low), max(high, window_ms[1])
        logarithmic = high > low > 0 and math.log10(high / low) > 1
        edges = [low * (high / low) ** (i / 30) for i in range(31)] if logarithmic else 30
        figure, axes = plt.subplots(figsize=(5, 3))
        axes.hist(list(eager_ms), bins=edges, color="#4477aa")
        if logarithmic:
            axes.set_xscale("log")
        axes.set(xlabel="eager time per forward pass (ms)", ylabel="tasks")
        figure.tight_layout()
        figure.savefig(directory / EAGER_PLOT, dpi=120)
        plt.close(figure)
        written["eager_ms"] = EAGER_PLOT
    return written

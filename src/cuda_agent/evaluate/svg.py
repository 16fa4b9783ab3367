"""Speed-up distribution plots as inline SVG: no plotting library, no external file, so the HTML
report stays one self-contained page that renders the same everywhere."""

from __future__ import annotations

import math
from html import escape

BIN_EDGES_LOG2 = [x / 2 for x in range(-6, 7)]
"""Histogram bin edges in log2(speed-up): 1/8x .. 8x in half-octaves; values outside go to the
first or last bin (drawn open-ended)."""
SERIES_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52")
_WIDTH, _HEIGHT, _LEFT, _BOTTOM, _TOP = 520, 220, 40, 40, 28


def _bin_counts(values: list[float]) -> list[int]:
    counts = [0] * (len(BIN_EDGES_LOG2) + 1)
    for value in values:
        position = math.log2(value)
        index = sum(position >= edge for edge in BIN_EDGES_LOG2)
        counts[index] += 1
    return counts


def _bin_label(index: int) -> str:
    if index == 0:
        return f"<{2 ** BIN_EDGES_LOG2[0]:g}x"
    if index == len(BIN_EDGES_LOG2):
        return f"≥{2 ** BIN_EDGES_LOG2[-1]:g}x"
    return f"{2 ** BIN_EDGES_LOG2[index - 1]:.3g}x"


def histogram_svg(series: dict[str, list[float]], title: str) -> str:
    """Grouped histogram of speed-ups (one colour per series) on a log2 axis, with the 1x line.

    Args:
        series: name -> speed-ups (positive numbers), e.g. ``{"run A": [...], "run B": [...]}``.
        title: shown above the plot.
    """
    counts = {name: _bin_counts(values) for name, values in series.items()}
    n_bins = len(BIN_EDGES_LOG2) + 1
    peak = max([1, *(c for per_bin in counts.values() for c in per_bin)])
    plot_w, plot_h = _WIDTH - _LEFT - 10, _HEIGHT - _BOTTOM - _TOP
    bin_w = plot_w / n_bins
    bar_w = bin_w * 0.8 / max(1, len(series))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" role="img" '
             f'aria-label="{escape(title)}" font-family="sans-serif" font-size="10">',
             f'<text x="{_LEFT}" y="14" font-size="12" font-weight="bold">{escape(title)}</text>']
    base_y = _TOP + plot_h
    for s, (name, per_bin) in enumerate(counts.items()):
        colour = SERIES_COLOURS[s % len(SERIES_COLOURS)]
        for i, count in enumerate(per_bin):
            if count:
                height = plot_h * count / peak
                x = _LEFT + i * bin_w + bin_w * 0.1 + s * bar_w
                parts.append(f'<rect x="{x:.1f}" y="{base_y - height:.1f}" width="{bar_w:.1f}" height="{height:.1f}" '
                             f'fill="{colour}"><title>{escape(name)}: {count} in {escape(_bin_label(i))}</title></rect>')
        parts.append(f'<rect x="{_WIDTH - 150}" y="{4 + 12 * s}" width="9" height="9" fill="{colour}"/>'
                     f'<text x="{_WIDTH - 137}" y="{12 + 12 * s}">{escape(name)} (n={len(series[name])})</text>')
    one_x = _LEFT + (sum(edge < 0 for edge in BIN_EDGES_LOG2) + 1) * bin_w
    parts.append(f'<line x1="{one_x:.1f}" y1="{_TOP}" x2="{one_x:.1f}" y2="{base_y}" stroke="#333" '
                 'stroke-dasharray="3,3"/>')
    parts.append(f'<line x1="{_LEFT}" y1="{base_y}" x2="{_LEFT + plot_w}" y2="{base_y}" stroke="#333"/>'
                 f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{base_y}" stroke="#333"/>')
    for i, edge in enumerate(BIN_EDGES_LOG2, start=1):  # a tick on every bin edge, a label on every octave
        x = _LEFT + i * bin_w
        parts.append(f'<line x1="{x:.1f}" y1="{base_y}" x2="{x:.1f}" y2="{base_y + 4}" stroke="#333"/>')
        if edge == int(edge):
            parts.append(f'<text x="{x:.1f}" y="{base_y + 15}" text-anchor="middle">{2 ** edge:g}x</text>')
    for count in sorted({0, peak // 2, peak}):
        y = base_y - plot_h * count / peak
        parts.append(f'<line x1="{_LEFT - 4}" y1="{y:.1f}" x2="{_LEFT}" y2="{y:.1f}" stroke="#333"/>'
                     f'<text x="{_LEFT - 6}" y="{y + 3:.1f}" text-anchor="end">{count}</text>')
    parts.append(f'<text x="12" y="{_TOP + plot_h / 2:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {_TOP + plot_h / 2:.1f})">tasks</text>'
                 f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_HEIGHT - 6}" text-anchor="middle">speed-up (bins of half an '
                 'octave; edge bins open-ended; dashed line: 1x)</text></svg>')
    return "".join(parts)

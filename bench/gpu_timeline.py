"""Each GPU's timeline in a self-check: how long its lanes held it alone, held it shared, or left it
unheld, from the verdicts' ``device_turns``.

A check's pace on a shared GPU is set by the GPU's turns (``dataset_check.py``'s ``device_held``
sums each verdict's turns, so it cannot tell a GPU held by five lanes at once from one held five
times as long by one lane at a time). Laying the turns of one GPU's lanes side by side answers
that: ``use_overlap`` is how many lanes an untimed hold served on average (1.0: untimed work ran
one lane at a time), ``idle`` the share of the span no lane held the GPU, and ``held_per_verdict``
which phases the turns went to.

    python bench/gpu_timeline.py verdicts_<time>.jsonl     # rows written by dataset_check.py run
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchlib import json_lines


def _union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by ``intervals`` (overlaps counted once)."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            covered += stop - max(start, end)
            end = stop
    return covered


def gpu_of(worker: str) -> str:
    """The GPU of a lane: ``cuda:1`` for lanes ``cuda:1`` and ``cuda:1.3``."""
    return worker.split(".", 1)[0]


def gpu_timeline(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per GPU (keyed as :func:`gpu_of`), over the span from its first turn to its last: the share
    held alone (``measure``), held shared (``shared``, any untimed hold open) and held by no lane
    (``idle``); ``use_overlap`` (untimed seconds held over the time any was open); the verdicts;
    and the mean seconds per verdict held for each ``"<mode> <phase>"``. Rows without turns (an
    unshared GPU, a verdict that ended before its first) are left out."""
    turns_by_gpu: dict[str, list[dict[str, Any]]] = defaultdict(list)
    verdicts: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.get("device_turns") and row.get("worker"):
            turns_by_gpu[gpu_of(row["worker"])] += row["device_turns"]
            verdicts[gpu_of(row["worker"])] += 1
    timelines = {}
    for gpu, turns in sorted(turns_by_gpu.items()):
        held = {mode: [(t["asked_at"] + t["wait_s"], t["asked_at"] + t["wait_s"] + t["held_s"])
                       for t in turns if t["mode"] == mode] for mode in ("measure", "use")}
        every = held["measure"] + held["use"]
        span = max(stop for _, stop in every) - min(start for start, _ in every)
        shared = _union(held["use"])
        by_phase: dict[str, float] = defaultdict(float)
        for turn in turns:
            by_phase[f"{turn['mode']} {turn['phase']}"] += turn["held_s"]
        timelines[gpu] = {
            "verdicts": verdicts[gpu], "span_s": span,
            "measure": _union(held["measure"]) / span if span else None,
            "shared": shared / span if span else None,
            "idle": (span - _union(every)) / span if span else None,
            "use_overlap": sum(stop - start for start, stop in held["use"]) / shared if shared else None,
            "held_per_verdict": {key: seconds / verdicts[gpu] for key, seconds in sorted(by_phase.items())},
        }
    return timelines


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} verdicts_<time>.jsonl")
    path = Path(sys.argv[1])
    rows = [row for _, row in json_lines(path)]
    timelines = gpu_timeline(rows)
    if not timelines:
        sys.exit(f"{path}: no row has device_turns and worker (rows from before 2026-11-29, or an unshared GPU)")
    print(json.dumps(timelines, indent=1))


if __name__ == "__main__":
    main()

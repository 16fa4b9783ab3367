"""The CPU stage between composing and filtering: composed tasks, in composer-seed order, lose
exact repeats, near-duplicates of earlier tasks and copies of a benchmark before any reaches a GPU.

Composer lanes finish seeds in any order, but de-duplication keeps the earliest of near-copies, so
the screen waits for each seed in turn: a seed is screened once every earlier seed is. Screening in
batches as seeds arrive gives the same tasks as screening them all at once
(:class:`~cuda_agent.synth.decontaminate.NearDuplicates`), so a run that streams its tasks to the
filter, and one that resumes, keep exactly the tasks of one that composed everything first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cuda_agent.synth.decontaminate import BenchmarkIndex, Drop, NearDuplicates, decontaminate
from cuda_agent.synth.records import Rejection, TaskRecord

COMPOSER_FAILED = "composer-failed"
"""Reason of a seed whose composer made no task (its entry's ``reason`` names another when known)."""


def drop_rejection(drop: Drop) -> Rejection:
    """The journal entry of a de-duplication or de-contamination drop."""
    return Rejection(drop.record.id, "decontaminate", drop.reason, f"{drop.matched} {drop.score:.3f}")


class Screen:
    """Composed entries in, screened tasks out, in the order of ``seeds``.

    Args:
        seeds: the run's composer seeds, in priority order.
        similarity: normalised-AST similarity at which a task is a copy.
        benchmark: the benchmark to de-contaminate against, or ``None``.
    """

    def __init__(self, seeds: Sequence[int], similarity: float, benchmark: BenchmarkIndex | None) -> None:
        self._seeds = list(seeds)
        self._position = 0
        self._waiting: dict[int, dict[str, Any]] = {}
        self._similarity, self._benchmark = similarity, benchmark
        self._duplicates = NearDuplicates(similarity)
        self._ids: set[str] = set()

    def add(self, entry: dict[str, Any]) -> None:
        """Take one composed entry (``{"seed", "record"}`` or ``{"seed", "error"[, "reason"]}``)."""
        self._waiting[int(entry["seed"])] = entry

    @property
    def ready(self) -> int:
        """Entries that :meth:`release` would screen now (those after a missing seed wait)."""
        count = 0
        while self._position + count < len(self._seeds) and self._seeds[self._position + count] in self._waiting:
            count += 1
        return count

    @property
    def complete(self) -> bool:
        """Every seed has been screened."""
        return self._position == len(self._seeds)

    @property
    def unscreened(self) -> int:
        """Seeds not screened yet (not composed, or waiting for an earlier seed)."""
        return len(self._seeds) - self._position

    def release(self) -> tuple[list[TaskRecord], list[Rejection]]:
        """Screen every entry whose earlier seeds are all screened.

        Returns:
            ``(kept, rejected)``: tasks for the filter in seed order, and the journal entries of
            composer failures, near-duplicates and benchmark copies.
        """
        entries = [self._waiting.pop(seed) for seed in self._seeds[self._position:self._position + self.ready]]
        self._position += len(entries)
        rejected, fresh = [], []
        for entry in entries:
            if "record" not in entry:
                rejected.append(Rejection(f"seed-{entry['seed']}", "compose", entry.get("reason", COMPOSER_FAILED),
                                          entry["error"]))
                continue
            record = TaskRecord.from_row(entry["record"])
            if record.id not in self._ids:  # two seeds that composed the same code: one id, one decision
                self._ids.add(record.id)
                fresh.append(record)
        kept, dropped = self._duplicates.screen(fresh)
        if self._benchmark is not None:
            kept, contaminated = decontaminate(kept, self._benchmark, self._similarity)
            dropped += contaminated
        return kept, rejected + [drop_rejection(drop) for drop in dropped]

"""``cuda-agent synth run``: compose, de-duplicate, de-contaminate and filter into a dataset.

Every stage writes down what it decided before moving on, so a crash or Ctrl-C loses nothing:

- composition appends each composed task (or the composer's failure) to ``composed.jsonl`` in the
  dataset directory; a resumed run reads it back instead of composing those seeds again (the
  composer sizes tasks by timing them, so composing again could give other code);
- de-duplication and de-contamination are cheap and deterministic, and run over every composed
  task on each (re)start; their drops are journaled like filter rejections;
- the execution filter runs ``workers`` lanes in parallel and journals each decision as it comes;
  tasks already decided are skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.synth.dataset import DatasetInfo, DatasetWriter, Rejection
from cuda_agent.synth.decontaminate import decontaminate, deduplicate, load_benchmark
from cuda_agent.synth.filter import FilterConfig, FilterOutcome, TaskFilter
from cuda_agent.synth.records import TaskRecord

COMPOSED = "composed.jsonl"

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as work completes (the CLI draws bars from it)."""


@dataclass
class RunConfig:
    """What one pipeline run makes; the composer itself is passed to :func:`run` separately."""

    n: int
    """Composer seeds to try: ``first_seed .. first_seed + n - 1``."""
    first_seed: int = 0
    filter: FilterConfig = field(default_factory=FilterConfig)
    workers: int = 1
    """Parallel filter lanes (one worker process each)."""
    benchmark: Path | None = None
    """Benchmark directory (e.g. a KernelBench checkout) to de-contaminate against."""
    similarity: float = 0.9
    """Normalised-AST similarity at or above which a task is a copy (paper: 0.9)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"synth: n must be >= 1, got {self.n}")
        if self.workers < 1:
            raise ValueError(f"synth: workers must be >= 1, got {self.workers}")
        if not 0 < self.similarity <= 1:
            raise ValueError(f"synth: similarity must be in (0, 1], got {self.similarity}")
        if self.benchmark is not None and not Path(self.benchmark).is_dir():
            raise ValueError(f"synth: benchmark {self.benchmark} is not a directory")


def run(config: RunConfig, out_dir: str | Path, composer: Callable[[int], TaskRecord],
        families: Mapping[str, str] | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Run every stage into ``out_dir`` (resuming it if it exists); return the dataset card's numbers.

    ``composer(seed)`` makes one task or raises ``ValueError`` / ``RuntimeError`` when it cannot
    (counted as a ``compose`` rejection). ``families`` maps operator names to families for the card.
    """
    out_dir = Path(out_dir)
    benchmark = load_benchmark(config.benchmark) if config.benchmark is not None else {}
    info = DatasetInfo(device=config.filter.device, eager_window_ms=config.filter.window)
    with DatasetWriter.open(out_dir, info) as writer:
        composed = compose_all(config, out_dir / COMPOSED, composer, progress)
        writer.append(rejected=composed.failures)
        candidates = _unique(composed.records)
        kept, dropped = deduplicate(candidates, config.similarity)
        if benchmark:
            kept, contaminated = decontaminate(kept, benchmark, config.similarity)
            dropped += contaminated
        writer.append(rejected=[Rejection(d.record.id, "decontaminate", d.reason, f"{d.matched} {d.score:.3f}")
                                for d in dropped])
        pending = [record for record in kept if record.id not in writer.decided]
        filter_all(pending, config, writer, progress)
        return writer.finalize(families)


@dataclass
class Composed:
    records: list[TaskRecord]
    failures: list[Rejection]


def compose_all(config: RunConfig, journal: Path, composer: Callable[[int], TaskRecord],
                progress: Progress | None = None) -> Composed:
    """Compose every seed not yet in ``journal``, appending each result as it is made."""
    done = _read_composed(journal)
    seeds = range(config.first_seed, config.first_seed + config.n)
    todo = [seed for seed in seeds if seed not in done]
    with open(journal, "a", encoding="utf-8") as out:
        for i, seed in enumerate(todo):
            try:
                entry: dict[str, Any] = {"seed": seed, "record": composer(seed).to_row()}
            except (ValueError, RuntimeError) as exc:
                entry = {"seed": seed, "error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(entry) + "\n")
            out.flush()
            os.fsync(out.fileno())
            done[seed] = entry
            if progress:
                progress("compose", i + 1, len(todo))
    records, failures = [], []
    for seed in seeds:
        entry = done[seed]
        if "record" in entry:
            records.append(TaskRecord.from_row(entry["record"]))
        else:
            failures.append(Rejection(f"seed-{seed}", "compose", "composer-failed", entry["error"]))
    return Composed(records, failures)


def filter_all(records: list[TaskRecord], config: RunConfig, writer: DatasetWriter,
               progress: Progress | None = None) -> None:
    """Run the execution filter over ``records`` in ``config.workers`` lanes, journaling each decision."""
    if not records:
        return
    lanes = [TaskFilter(config.filter) for _ in range(min(config.workers, len(records)))]
    pool = ThreadPoolExecutor(max_workers=len(lanes))
    queue = iter(records)
    running: dict[Future, tuple[TaskFilter, TaskRecord]] = {}

    def feed(lane: TaskFilter) -> None:
        record = next(queue, None)
        if record is not None:
            running[pool.submit(lane.check, record)] = (lane, record)

    try:
        for lane in lanes:
            feed(lane)
        finished = 0
        while running:
            ready, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in ready:
                lane, record = running.pop(future)
                _journal_outcome(writer, record, future.result(), config.filter.device)
                finished += 1
                if progress:
                    progress("filter", finished, len(records))
                feed(lane)
    finally:
        for lane in lanes:  # on Ctrl-C, stops in-flight checks at once; their results are not journaled
            lane.close()
        pool.shutdown(wait=True, cancel_futures=True)


def _journal_outcome(writer: DatasetWriter, record: TaskRecord, outcome: FilterOutcome, device: str) -> None:
    if outcome.accepted:
        record.eager_ms, record.compile_ms, record.device = outcome.eager_ms, outcome.compile_ms, device
        writer.append(accepted=[record])
    else:
        writer.append(rejected=[Rejection(record.id, "filter", outcome.reason, outcome.detail)])


def _unique(records: Iterable[TaskRecord]) -> list[TaskRecord]:
    """Drop exact repeats (two seeds that composed the same code): one id, one decision."""
    seen: set[str] = set()
    return [r for r in records if not (r.id in seen or seen.add(r.id))]


def _read_composed(journal: Path) -> dict[int, dict[str, Any]]:
    """Seed -> journal entry; a torn last line (a crash mid-write) is dropped and rewritten."""
    if not journal.exists():
        return {}
    entries: dict[int, dict[str, Any]] = {}
    lines = journal.read_bytes().split(b"\n")
    offset = 0
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                entry = json.loads(line)
                entries[int(entry["seed"])] = entry
            except (ValueError, KeyError, TypeError):
                if any(rest.strip() for rest in lines[number:]):
                    raise ValueError(f"{journal}: line {number} is not a composed-task entry; the file is "
                                     "corrupt (delete it to compose again)") from None
                with open(journal, "r+b") as f:
                    f.truncate(offset)
                break
        offset += len(line) + 1
    return entries

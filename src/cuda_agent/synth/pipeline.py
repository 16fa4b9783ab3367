"""``cuda-agent synth run``: compose, de-duplicate, de-contaminate and filter into a dataset.

Every stage writes down what it decided before moving on, so a crash or Ctrl-C loses nothing:

- composition appends each composed task (or the composer's failure) to ``composed.jsonl`` in the
  dataset directory; a resumed run reads it back instead of composing those seeds again (the
  composer sizes tasks by timing them, so composing again could give other code);
- de-duplication and de-contamination are cheap and deterministic, and run over every composed
  task on each (re)start; their drops are journaled like filter rejections;
- the execution filter runs ``workers`` lanes in parallel and journals each decision as it comes;
  tasks already decided are skipped.

With a time limit, a stage stops starting work when it runs out (work in flight is dropped, as on
Ctrl-C); the dataset is finalized from what was decided, and running the same command resumes.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.synth.compose_workers import compose_parallel
from cuda_agent.synth.dataset import DatasetInfo, DatasetWriter, Rejection
from cuda_agent.synth.decontaminate import Drop, decontaminate, deduplicate, load_benchmark
from cuda_agent.synth.filter import FilterConfig, FilterOutcome, TaskFilter
from cuda_agent.synth.lanes import run_in_lanes
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
    """Parallel lanes per stage: composer processes (or LLM requests), then filter worker processes."""
    time_limit_s: float | None = None
    """Stop starting work after this many seconds (then finalize what was decided); ``None``: no limit."""
    benchmark: Path | None = None
    """Benchmark directory (e.g. a KernelBench checkout) to de-contaminate against."""
    similarity: float = 0.9
    """Normalised-AST similarity at or above which a task is a copy (paper: 0.9)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"synth: n must be >= 1, got {self.n}")
        if self.workers < 1:
            raise ValueError(f"synth: workers must be >= 1, got {self.workers}")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise ValueError(f"synth: time_limit_s must be > 0, got {self.time_limit_s}")
        if not 0 < self.similarity <= 1:
            raise ValueError(f"synth: similarity must be in (0, 1], got {self.similarity}")
        if self.benchmark is not None and not Path(self.benchmark).is_dir():
            raise ValueError(f"synth: benchmark {self.benchmark} is not a directory")


def run(config: RunConfig, out_dir: str | Path, composer: Callable[[int], TaskRecord],
        families: Mapping[str, str] | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Run every stage into ``out_dir`` (resuming it if it exists); return the dataset card's numbers.

    ``composer(seed)`` makes one task or raises ``ValueError`` / ``RuntimeError`` when it cannot
    (counted as a ``compose`` rejection). Its ``parallel`` attribute says how to run ``workers`` of
    them at once: ``"processes"`` (it must pickle) or ``"threads"`` (the default). ``families``
    maps operator names to families for the card. The numbers gain ``pending`` (composer seeds
    not decided yet because the time limit was reached) and ``this_run`` (``seconds``, and the
    ``accepted`` and ``decided`` tasks of this call, ``accepted_per_minute``, and
    ``filter_lane_seconds``: the filter's time per step summed over lanes, see
    :attr:`FilterOutcome.seconds`).
    """
    out_dir = Path(out_dir)
    deadline = None if config.time_limit_s is None else time.monotonic() + config.time_limit_s
    benchmark = load_benchmark(config.benchmark) if config.benchmark is not None else {}
    info = DatasetInfo(device=config.filter.device, eager_window_ms=config.filter.window)
    started = time.monotonic()
    with DatasetWriter.open(out_dir, info) as writer:
        accepted_before, decided_before = len(writer.accepted), len(writer.decided)
        composed = compose_all(config, out_dir / COMPOSED, composer, progress, deadline)
        writer.append(rejected=composed.failures)
        pending: list[TaskRecord] = []
        filter_seconds: dict[str, float] = {}
        if composed.missing == 0:  # de-duplication keeps the earliest seed: it needs them all
            candidates = _unique(composed.records)
            kept, dropped = deduplicate(candidates, config.similarity)
            if benchmark:
                kept, contaminated = decontaminate(kept, benchmark, config.similarity)
                dropped += contaminated
            writer.append(rejected=[_rejection(drop) for drop in dropped])
            pending = [record for record in kept if record.id not in writer.decided]
            filtered = filter_all(pending, config, writer, progress, deadline)
            pending, filter_seconds = filtered.pending, filtered.seconds
        numbers = writer.finalize(families)
    seconds = time.monotonic() - started
    accepted = numbers["tasks"] - accepted_before
    numbers["pending"] = composed.missing + len(pending)
    numbers["this_run"] = {"seconds": seconds, "accepted": accepted, "decided": numbers["decided"] - decided_before,
                           "accepted_per_minute": accepted * 60 / seconds, "filter_lane_seconds": filter_seconds}
    return numbers


def decontaminate_dataset(out_dir: str | Path, benchmark: str | Path, similarity: float = 0.9) -> dict[str, Any]:
    """De-contaminate a dataset against a benchmark given after it was made (e.g. a new KernelBench
    level): its near-copies are withdrawn (journaled as ``decontaminate`` rejections) and the files
    and card rewritten. It measures nothing, so it runs on any machine and torch.

    Returns:
        The card's numbers, with ``withdrawn``: how many tasks this call removed.

    Raises:
        DatasetError: ``out_dir`` is not a dataset directory.
        ValueError: ``benchmark`` is not a folder of task files.
    """
    with DatasetWriter.reopen(out_dir) as writer:
        _, dropped = decontaminate(writer.accepted, load_benchmark(benchmark), similarity)
        writer.append(rejected=[_rejection(drop) for drop in dropped])
        numbers = writer.finalize(writer.families())
    numbers["withdrawn"] = len(dropped)
    return numbers


def _rejection(drop: Drop) -> Rejection:
    return Rejection(drop.record.id, "decontaminate", drop.reason, f"{drop.matched} {drop.score:.3f}")


@dataclass
class Composed:
    records: list[TaskRecord]
    failures: list[Rejection]
    missing: int = 0
    """Seeds not composed yet (the time limit came first)."""


def compose_all(config: RunConfig, journal: Path, composer: Callable[[int], TaskRecord],
                progress: Progress | None = None, deadline: float | None = None) -> Composed:
    """Compose every seed not yet in ``journal`` with ``config.workers`` at once, appending each
    result as it is made; seeds still to do at ``deadline`` (``time.monotonic()``) are left."""
    done = _read_composed(journal)
    seeds = range(config.first_seed, config.first_seed + config.n)
    todo = [seed for seed in seeds if seed not in done]
    with open(journal, "a", encoding="utf-8") as out:
        for i, entry in enumerate(compose_parallel(composer, todo, config.workers, deadline)):
            out.write(json.dumps(entry) + "\n")
            out.flush()
            os.fsync(out.fileno())
            done[entry["seed"]] = entry
            if progress:
                progress("compose", i + 1, len(todo))
    records, failures = [], []
    for seed in seeds:
        entry = done.get(seed)
        if entry is None:
            continue
        if "record" in entry:
            records.append(TaskRecord.from_row(entry["record"]))
        else:
            failures.append(Rejection(f"seed-{seed}", "compose", "composer-failed", entry["error"]))
    return Composed(records, failures, missing=sum(seed not in done for seed in seeds))


@dataclass
class Filtered:
    pending: list[TaskRecord]
    """Records left undecided (the time limit came first)."""
    seconds: dict[str, float]
    """Time per filter step, summed over lanes (:attr:`FilterOutcome.seconds`)."""


def filter_all(records: list[TaskRecord], config: RunConfig, writer: DatasetWriter,
               progress: Progress | None = None, deadline: float | None = None) -> Filtered:
    """Run the execution filter over ``records`` in ``config.workers`` lanes, journaling each
    decision, until ``deadline`` (``time.monotonic()``).

    Raises:
        ValueError: on a GPU, the lanes' memory bounds together exceed its free memory.
    """
    if not records:
        return Filtered([], {})
    n_lanes = min(config.workers, len(records))
    _check_device_memory(config.filter, n_lanes)
    lanes = [TaskFilter(config.filter) for _ in range(n_lanes)]
    decided: set[str] = set()
    seconds: Counter[str] = Counter()
    try:
        for record, outcome in run_in_lanes([lane.check for lane in lanes], records, deadline):
            _journal_outcome(writer, record, outcome, config.filter.device)
            decided.add(record.id)
            seconds.update(outcome.seconds)
            if progress:
                progress("filter", len(decided), len(records))
    finally:
        for lane in lanes:  # on Ctrl-C or the time limit, stops in-flight checks at once; they are not journaled
            lane.close()
    return Filtered([record for record in records if record.id not in decided], dict(seconds))


def _check_device_memory(config: FilterConfig, n_lanes: int) -> None:
    """Lanes run tasks side by side: on a GPU their bounds must fit, or they fail each other."""
    if not config.device.startswith("cuda"):
        return
    import torch

    free_mb = torch.cuda.mem_get_info(torch.device(config.device))[0] / 2**20
    if n_lanes * config.memory_bound_mb > free_mb:
        raise ValueError(f"synth: {n_lanes} filter lanes x max_memory_mb {config.memory_bound_mb:g} MB exceed the "
                         f"{free_mb:.0f} MB free on {config.device}; use fewer workers or a lower max_memory_mb")


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

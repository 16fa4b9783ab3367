"""``cuda-agent synth run``: compose, bound, screen and filter into a dataset, all stages at once.

- **Compose** — ``compose_workers`` lanes (processes for the deterministic composer, spread over
  the run's GPUs, where it times sizes; threads for an LLM composer).
- **Bound** — each composed task's inputs are measured on the meta device (an
  :class:`~cuda_agent.synth.input_size.InputSizer` worker) and a task over the size bound is scaled
  down (:mod:`cuda_agent.synth.input_size`).
- **Screen** — in seed order: exact repeats, near-duplicates, benchmark copies
  (:mod:`cuda_agent.synth.screen`).
- **Filter** — ``workers`` lanes spread over the run's devices, one group per GPU
  (:mod:`cuda_agent.synth.devices`): each lane's worker sees one GPU and takes that GPU's
  measurement lock, so the GPUs measure side by side. Lanes take the next screened task as soon as
  they are free, while composition goes on.

This thread does the bookkeeping between the stages, and every stage writes down what it decided
before it is used, so a crash or Ctrl-C loses nothing:

- each composed and bounded task (or the composer's failure) is appended to ``composed.jsonl``; a
  resumed run reads it back instead of composing those seeds again (the composer sizes tasks by
  timing them, so composing again could give other code);
- screening is cheap and deterministic, and is replayed over every composed task on each
  (re)start; its drops are journaled like filter rejections;
- each filter decision is journaled as it comes, with the lane that made it; tasks already
  decided are skipped;
- each call appends its settings, machine and counts to ``runs.jsonl`` (the data card's "how it
  was made").

With a time limit, no stage starts work after it (work in flight is dropped, as on Ctrl-C); the
dataset is finalized from what was decided, and running the same command resumes.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from cuda_agent.synth import checks
from cuda_agent.synth.compose_workers import composer_lanes
from cuda_agent.synth.dataset import COMPOSED, RUNS, DatasetInfo, DatasetWriter
from cuda_agent.synth.decontaminate import BenchmarkIndex, decontaminate, load_benchmark
from cuda_agent.synth.devices import LaneDevice, describe_gpus, lane_devices, spread
from cuda_agent.synth.diversity import DEFAULT_MAX_OP_SEQUENCE_SHARE
from cuda_agent.synth.filter import FilterConfig, FilterOutcome, TaskFilter
from cuda_agent.synth.input_size import DEFAULT_MAX_INPUT_MB, InputSizer, SizeBoundError, read_size
from cuda_agent.synth.lanes import Finished, LaneGroup, next_finished
from cuda_agent.synth.records import Rejection, TaskRecord
from cuda_agent.synth.screen import Screen, drop_rejection

OVER_BOUND = "inputs-over-bound"
"""Compose-stage reason of a task the size bound could not be met for."""

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
    """Filter lanes, spread over ``devices`` (16 per H100 kept its measurement lock busy)."""
    compose_workers: int | None = None
    """Composer lanes (processes, or LLM requests in flight); ``None``: ``workers`` // 4, at least
    one (on an H100 one composer process kept about four filter lanes fed)."""
    devices: tuple[str, ...] | None = None
    """On ``cuda``, the GPUs to spread lanes over as ``CUDA_VISIBLE_DEVICES`` entries (``None``:
    every visible GPU); on ``cpu``, lane group names ``cpu:<k>`` (``None``: one group)."""
    time_limit_s: float | None = None
    """Stop starting work after this many seconds (then finalize what was decided); ``None``: no limit."""
    benchmark: Path | None = None
    """Benchmark directory (e.g. a KernelBench checkout) to de-contaminate against."""
    similarity: float = 0.9
    """Normalised-AST similarity at or above which a task is a copy (paper: 0.9)."""
    max_input_mb: float = DEFAULT_MAX_INPUT_MB
    """The size bound on one task's inputs (MiB): larger tasks are scaled down."""
    max_op_sequence_share: float = DEFAULT_MAX_OP_SEQUENCE_SHARE
    """Most of the dataset one operator sequence may hold."""
    batch_size: int = 100
    """Filter decisions per progress report (``on_batch``)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"synth: n must be >= 1, got {self.n}")
        if self.workers < 1:
            raise ValueError(f"synth: workers must be >= 1, got {self.workers}")
        if self.compose_workers is not None and self.compose_workers < 1:
            raise ValueError(f"synth: compose_workers must be >= 1, got {self.compose_workers}")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise ValueError(f"synth: time_limit_s must be > 0, got {self.time_limit_s}")
        if not 0 < self.similarity <= 1:
            raise ValueError(f"synth: similarity must be in (0, 1], got {self.similarity}")
        if self.benchmark is not None and not Path(self.benchmark).is_dir():
            raise ValueError(f"synth: benchmark {self.benchmark} is not a directory")
        if self.batch_size < 1:
            raise ValueError(f"synth: batch_size must be >= 1, got {self.batch_size}")
        if not self.max_input_mb > 0:
            raise ValueError(f"synth: max_input_mb must be > 0, got {self.max_input_mb}")
        if not 0 < self.max_op_sequence_share <= 1:
            raise ValueError(f"synth: max_op_sequence_share must be in (0, 1], got {self.max_op_sequence_share}")
        lane_devices(self.filter.device, self.devices)  # a device that is not there fails now, not after composing

    @property
    def composer_lanes(self) -> int:
        return self.compose_workers if self.compose_workers is not None else max(1, self.workers // 4)


@dataclass
class RunStatus:
    """Where a run stands: passed to ``on_batch`` after every ``batch_size`` filter decisions."""

    elapsed_s: float
    seeds: int
    composed: int
    """Seeds composed so far (earlier calls included)."""
    screened: int
    """Seeds screened so far."""
    queued: int
    """Screened tasks waiting for a filter lane."""
    filtering: int
    """Tasks a filter lane is checking now."""
    decided: int
    """Filter decisions of this call."""
    accepted: int
    """Tasks accepted by this call."""
    per_device: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per device: ``decided``, ``accepted`` and ``lock_s`` (seconds its lanes held its
    measurement lock, the device's busy time) in this call."""

    @property
    def accepted_per_minute(self) -> float:
        return self.accepted * 60 / self.elapsed_s if self.elapsed_s > 0 else 0.0


def run(config: RunConfig, out_dir: str | Path, composer: Callable[[int], TaskRecord],
        families: Mapping[str, str] | None = None, progress: Progress | None = None,
        on_batch: Callable[[RunStatus], None] | None = None, command: str | None = None) -> dict[str, Any]:
    """Run every stage into ``out_dir`` (resuming it if it exists); return the dataset card's numbers.

    ``composer(seed)`` makes one task or raises ``ValueError`` / ``RuntimeError`` when it cannot
    (counted as a ``compose`` rejection). Its ``parallel`` attribute says how to run several at
    once: ``"processes"`` (it must pickle) or ``"threads"`` (the default); a ``device_memory_mb``
    attribute counts in the GPU memory check. ``families`` maps operator names to families for
    the card; ``command`` is recorded in ``runs.jsonl``. The numbers gain ``pending`` (seeds not
    decided yet because the time limit was reached) and ``this_run`` (the :class:`RunStatus` fields,
    ``seconds``, ``accepted_per_minute`` and ``filter_lane_seconds``: the filter's time per step
    summed over lanes, see :attr:`FilterOutcome.seconds`).

    Raises:
        ValueError: bad devices, or on a GPU the lanes' memory bounds exceed its free memory.
        DatasetError: ``out_dir`` was started with other settings, or its journal is corrupt.
    """
    out_dir = Path(out_dir)
    devices = lane_devices(config.filter.device, config.devices)
    filter_devices = spread(config.workers, devices)
    composer_devices = spread(config.composer_lanes, devices)
    _check_device_memory(config.filter, filter_devices, composer_devices, getattr(composer, "device_memory_mb", 0.0))
    benchmark = BenchmarkIndex.of(load_benchmark(config.benchmark)) if config.benchmark is not None else None
    info = DatasetInfo(device=config.filter.device, eager_window_ms=config.filter.window,
                       max_input_mb=config.max_input_mb, max_op_sequence_share=config.max_op_sequence_share)
    with DatasetWriter.open(out_dir, info) as writer, InputSizer() as sizer:
        state = _Run(config, writer, out_dir / COMPOSED, Screen(range(config.first_seed, config.first_seed + config.n),
                                                                  config.similarity, benchmark), sizer)
        try:
            state.go(composer, filter_devices, composer_devices, progress, on_batch)
        finally:
            _append_run_record(out_dir / RUNS, config, command, devices, state)
        numbers = writer.finalize(families)
    status = state.status()
    numbers["pending"] = state.screen.unscreened + state.released - status.decided
    numbers["this_run"] = {**asdict(status), "seconds": status.elapsed_s, "composed": state.composed_now,
                           "accepted_per_minute": status.accepted_per_minute,
                           "filter_lane_seconds": dict(state.filter_seconds)}
    return numbers


def decontaminate_dataset(out_dir: str | Path, benchmark: str | Path, similarity: float = 0.9) -> dict[str, Any]:
    """De-contaminate a dataset against a benchmark given after it was made (e.g. a new KernelBench
    level): its near-copies are withdrawn (journaled as ``decontaminate`` rejections) and the files
    and card rewritten. It measures nothing, so it runs on any machine and torch.

    Returns:
        The card's numbers, with ``withdrawn``: how many tasks this call removed.

    Raises:
        DatasetError: ``out_dir`` is not a dataset directory (with its journal).
        ValueError: ``benchmark`` is not a folder of task files.
    """
    with DatasetWriter.reopen(out_dir) as writer:
        _, dropped = decontaminate(writer.accepted, load_benchmark(benchmark), similarity)
        writer.append(rejected=[drop_rejection(drop) for drop in dropped])
        numbers = writer.finalize(writer.families())
    numbers["withdrawn"] = len(dropped)
    return numbers


def apply_checks(out_dir: str | Path, checks_path: str | Path) -> dict[str, Any]:
    """Take a set's self-check into it: the tasks whose check says they cannot be judged are
    withdrawn (journaled as ``self_check`` rejections, by status), and the ``correct`` ones take the
    check's eager and compile times (TF32 off). Tasks without a check, or whose check said nothing
    certain about them (:data:`~cuda_agent.synth.checks.RETRIED`), are left as they are. Measures nothing.

    Returns:
        The card's numbers, with ``withdrawn`` and ``retimed``: how many tasks this call removed and
        gave new times.

    Raises:
        DatasetError: ``out_dir`` is not a dataset directory (with its journal).
        ValueError: ``checks_path`` is neither a ``checks.parquet`` nor a ``tasks check`` results folder.
    """
    rows = checks.load(Path(checks_path))
    with DatasetWriter.reopen(out_dir) as writer:
        in_set = {record.id for record in writer.accepted}
        withdrawn = [checks.rejection(row) for task, row in rows.items() if task in in_set and checks.failed(row)]
        writer.append(rejected=withdrawn)
        retimed = writer.retime(checks.times(rows))
        numbers = writer.finalize(writer.families())
    numbers["withdrawn"], numbers["retimed"] = len(withdrawn), retimed
    return numbers


class _Run:
    """One call's bookkeeping: the composed journal, the screen, the lanes and the counts."""

    def __init__(self, config: RunConfig, writer: DatasetWriter, journal: Path, screen: Screen,
                 sizer: InputSizer) -> None:
        self.config, self.writer, self.journal, self.screen, self.sizer = config, writer, journal, screen, sizer
        self.started = time.monotonic()
        self.deadline = None if config.time_limit_s is None else self.started + config.time_limit_s
        self.composed_before = 0
        self.composed_now = 0
        self.decided = self.accepted = 0
        self.per_device: dict[str, Counter[str]] = {}
        self.filter_seconds: Counter[str] = Counter()
        self._filters: LaneGroup | None = None
        self.released = 0
        """Screened tasks of this call sent to the filter (undecided when they were screened)."""

    def go(self, composer: Callable[[int], TaskRecord], filter_devices: Sequence[LaneDevice],
           composer_devices: Sequence[LaneDevice], progress: Progress | None,
           on_batch: Callable[[RunStatus], None] | None) -> None:
        """Run the stages until every seed is decided or the deadline comes."""
        done = _read_composed(self.journal)
        self.composed_before = len(done)
        seeds = range(self.config.first_seed, self.config.first_seed + self.config.n)
        for seed in seeds:
            if seed in done:
                self.screen.add(self._bounded(done[seed], journal=None) if "input_bytes" not in done[seed]
                                else done[seed])
        todo = [seed for seed in seeds if seed not in done]
        outbox: queue.Queue = queue.Queue()
        filters = [TaskFilter(self.config.filter, device) for device in filter_devices]
        names = [f"{device.name}/{index}" for index, device in enumerate(filter_devices)]
        with composer_lanes(composer, composer_devices[:max(1, min(len(composer_devices), len(todo)))]) as lanes, \
                open(self.journal, "a", encoding="utf-8") as journal:
            composing = LaneGroup("compose", lanes, outbox, self.deadline)
            self._filters = LaneGroup("filter", [lane.check for lane in filters], outbox, self.deadline)
            composing.put(todo)
            composing.close()
            try:
                self._release(composing)
                while (finished := next_finished(outbox, [composing, self._filters], self.deadline)) is not None:
                    if finished.group == "compose":
                        self.screen.add(self._bounded(finished.result(), journal))
                        self.composed_now += 1
                        if progress:
                            progress("compose", self.composed_now, len(todo))
                    else:
                        self._decide(finished, filter_devices, names, progress, on_batch)
                    self._release(composing)
            finally:
                composing.stop()
                self._filters.stop()
                for lane in filters:  # on Ctrl-C or the time limit, stops in-flight checks at once
                    lane.close()
        if on_batch:
            on_batch(self.status())

    def _bounded(self, entry: dict[str, Any], journal: IO[str] | None) -> dict[str, Any]:
        """The composed entry within the size bound (scaled down, or a failure), journaled when
        ``journal`` is given."""
        max_bytes = int(self.config.max_input_mb * 2**20)
        read = read_size(entry["record"]["code"]) if "record" in entry else None
        if read is not None and read.nbytes <= max_bytes:  # the common case: no worker needed
            entry = {**entry, "input_bytes": read.nbytes}
        elif "record" in entry:
            record = TaskRecord.from_row(entry["record"])
            try:
                bounded = self.sizer.bound(record.code, max_bytes)
            except SizeBoundError as exc:
                entry = {"seed": entry["seed"], "error": str(exc), "reason": OVER_BOUND}
            except ValueError:  # get_inputs() does not run on the meta device: the filter judges it as it is
                entry = {**entry, "input_bytes": None}
            else:
                record.code = bounded.code
                entry = {"seed": entry["seed"], "record": record.to_row(), "input_bytes": bounded.nbytes,
                         **({"resized_from_bytes": bounded.original_nbytes} if bounded.resized else {})}
        if journal is not None:
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
        return entry

    def _release(self, composing: LaneGroup) -> None:
        """Screen what is ready, when the filter would otherwise starve or a batch has gathered;
        close the filter's inbox once every seed is screened."""
        filters = self._filters
        assert filters is not None
        starving = filters.queued < 2 * filters.lanes
        if self.screen.ready and (starving or self.screen.ready >= 64 or composing.finished):
            kept, rejected = self.screen.release()
            self.writer.append(rejected=rejected)
            todo = [record for record in kept if record.id not in self.writer.decided]
            self.released += len(todo)
            filters.put(todo)
        if self.screen.complete:
            filters.close()

    def _decide(self, finished: Finished, devices: Sequence[LaneDevice], names: Sequence[str],
                progress: Progress | None, on_batch: Callable[[RunStatus], None] | None) -> None:
        record: TaskRecord = finished.item
        outcome: FilterOutcome = finished.result()
        device = devices[finished.lane].name
        note = {"lane": names[finished.lane]}
        if outcome.accepted:
            record.eager_ms, record.compile_ms, record.device = outcome.eager_ms, outcome.compile_ms, \
                self.config.filter.device
            self.writer.append(accepted=[record], note=note)
        else:
            self.writer.append(rejected=[Rejection(record.id, "filter", outcome.reason, outcome.detail)], note=note)
        self.decided += 1
        self.accepted += outcome.accepted
        counts = self.per_device.setdefault(device, Counter())
        counts.update(decided=1, accepted=int(outcome.accepted),
                      lock_s=sum(outcome.seconds.get(step, 0.0) for step in ("checks", "eager-timing",
                                                                            "compile-timing")))
        self.filter_seconds.update(outcome.seconds)
        if progress:
            progress("filter", self.decided, self.released)
        if on_batch and self.decided % self.config.batch_size == 0:
            on_batch(self.status())

    def status(self) -> RunStatus:
        filters = self._filters
        return RunStatus(elapsed_s=time.monotonic() - self.started, seeds=self.config.n,
                         composed=self.composed_before + self.composed_now,
                         screened=self.config.n - self.screen.unscreened,
                         queued=filters.queued if filters else 0, filtering=filters.in_flight if filters else 0,
                         decided=self.decided, accepted=self.accepted,
                         per_device={name: dict(counts) for name, counts in sorted(self.per_device.items())})


def _check_device_memory(config: FilterConfig, filter_devices: Sequence[LaneDevice],
                         composer_devices: Sequence[LaneDevice], composer_mb: float) -> None:
    """Lanes run side by side: on each GPU their bounds must fit its free memory, or they fail
    each other."""
    if not config.device.startswith("cuda"):
        return
    import torch

    for device in dict.fromkeys(filter_devices):
        lanes = filter_devices.count(device)
        composers = composer_devices.count(device)
        needed = lanes * config.memory_bound_mb + composers * composer_mb
        free_mb = torch.cuda.mem_get_info(torch.device(device.name))[0] / 2**20
        if needed > free_mb:
            raise ValueError(f"synth: on {device.name} (GPU {device.visible}), {lanes} filter lanes x max_memory_mb "
                             f"{config.memory_bound_mb:g} MB + {composers} composers x {composer_mb:g} MB exceed its "
                             f"{free_mb:.0f} MB free; use fewer workers or a lower max_memory_mb")


def _append_run_record(path: Path, config: RunConfig, command: str | None, devices: Sequence[LaneDevice],
                       state: _Run) -> None:
    """One line of ``runs.jsonl``: this call's settings, machine and counts."""
    import torch

    status = state.status()
    record = {
        "started": time.time() - status.elapsed_s,
        "command": command,
        "machine": {"cpus": os.cpu_count(), "gpus": describe_gpus(devices), "torch": torch.__version__,
                    "cuda": torch.version.cuda},
        "config": {"n": config.n, "first_seed": config.first_seed, "workers": config.workers,
                   "compose_workers": config.composer_lanes, "devices": [device.name for device in devices],
                   "time_limit_s": config.time_limit_s, "max_input_mb": config.max_input_mb,
                   "max_op_sequence_share": config.max_op_sequence_share,
                   "filter": {"device": config.filter.device, "window_ms": list(config.filter.window),
                              "max_memory_mb": config.filter.memory_bound_mb, "compile": config.filter.compile,
                              "restart_every": config.filter.restart_every}},
        "this_run": {**asdict(status), "seconds": status.elapsed_s, "composed": state.composed_now,
                     "accepted_per_minute": status.accepted_per_minute},
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())


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

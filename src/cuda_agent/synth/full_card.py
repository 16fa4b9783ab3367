"""``cuda-agent synth card``: the full data card of a dataset directory, from the dataset and the
records its runs left beside it.

Sources, each optional except the data file:

- ``tasks.parquet`` / ``tasks.jsonl`` and ``meta.json``: the tasks and the settings;
- ``journal.jsonl``: the rejections per rule, and the tasks withdrawn as benchmark copies;
- ``runs.jsonl``: each ``synth run`` call's command, machine, hours and counts;
- ``composed.jsonl``: the composed tasks the size bound scaled down;
- ``seed_ops.json``: the seed-op catalogue, for coverage per family;
- a benchmark folder (``--benchmark``): the decontamination report, per folder of task files
  (``level1``, ``level2``, ``level3`` of a KernelBench checkout);
- the set's self-check (``--checks``): how many tasks the full verdict judged ``correct`` with
  their own reference as the candidate, from the ``checks.parquet`` gathered over several
  ``tasks check`` runs (:mod:`cuda_agent.synth.checks`) or from one run's results folder.

Input sizes are read from the source where it follows the composers' template, else measured by
running the task's ``get_inputs()`` on the meta device in a worker process
(:class:`~cuda_agent.synth.input_size.InputSizer`), so the card can be made on any machine.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuda_agent.synth.card import render_card
from cuda_agent.synth.card_plots import write_plots
from cuda_agent.synth.checks import failed, load as load_checks, times as check_times
from cuda_agent.synth.dataset import CARD, COMPOSED, JOURNAL, RUNS, DatasetError, read_dataset, read_journal, stats
from cuda_agent.synth.decontaminate import BenchmarkIndex, decontaminate, load_benchmark
from cuda_agent.synth.diversity import family_coverage, near_duplicate_clusters, op_sequence_counts
from cuda_agent.synth.input_size import DEFAULT_MAX_INPUT_MB, InputSize, InputSizer, read_size
from cuda_agent.synth.records import SEED_OPS, TaskRecord

CLOSE_SIMILARITY = 0.8
"""The decontamination report also counts tasks this similar to a benchmark file (kept, but close)."""
_SIZE_BUCKETS_MB = (16, 64, 256, 1024, 4096)


def make_card(dataset: str | Path, out: str | Path | None = None, benchmark: str | Path | None = None,
              checks: str | Path | None = None, similarity: float = 0.9, plots: bool = True) -> dict[str, Any]:
    """Write the full data card of a dataset directory.

    Args:
        dataset: the dataset directory (``tasks.parquet`` or ``tasks.jsonl`` inside).
        out: the card's path (default ``<dataset>/README.md``); the PNGs go beside it.
        benchmark: a benchmark folder for the decontamination report (e.g. ``KernelBench/KernelBench``).
        checks: the set's ``checks.parquet``, or a ``tasks check`` results folder (or its
            ``results.sqlite``).
        similarity: the decontamination threshold the report counts at.
        plots: write the histograms (needs matplotlib).

    Returns:
        The card's numbers (:func:`cuda_agent.synth.dataset.stats` plus the full card's sections).

    Raises:
        DatasetError: ``dataset`` is not a dataset directory, or one of its files is malformed.
        ValueError: the benchmark or checks folder cannot be read (the message names it).
        ImportError: ``plots`` without matplotlib.
    """
    directory = Path(dataset)
    if not directory.is_dir():
        raise DatasetError(f"{directory}: not a dataset directory (expected the folder holding tasks.parquet)")
    out = Path(out) if out is not None else directory / CARD
    records = read_dataset(directory)
    numbers = stats(directory)
    numbers["runs"] = _read_jsonl(directory / RUNS)
    with InputSizer() as sizer:
        sizes = {record.id: _measured(sizer, record) for record in records}
    numbers["input_sizes"] = input_size_numbers(sizes, numbers["run"].get("max_input_mb"),
                                                _resized_ids(directory / COMPOSED))
    shapes = {task: size.shapes for task, size in sizes.items() if size is not None}
    numbers["diversity"] = diversity_numbers(records, shapes)
    numbers["coverage"] = _coverage(records, directory / SEED_OPS)
    numbers["checks"] = None if checks is None else read_checks(
        Path(checks), {record.id: (record.eager_ms, record.compile_ms) for record in records},
        numbers["run"].get("eager_window_ms"))
    if benchmark is not None:
        withdrawn = [entry for entry in (read_journal(directory / JOURNAL)[1] if (directory / JOURNAL).exists()
                                         else []) if entry.reason == "benchmark_match"]
        numbers["decontamination"] = decontamination_numbers(records, Path(benchmark), withdrawn, similarity)
    if plots:
        out.parent.mkdir(parents=True, exist_ok=True)
        numbers["plots"] = write_plots(out.parent, numbers["ops_per_task"],
                                       [record.eager_ms for record in records if record.eager_ms is not None],
                                       numbers["run"].get("eager_window_ms"))
    out.write_text(render_card(numbers), encoding="utf-8")
    return numbers


def _measured(sizer: InputSizer, record: TaskRecord) -> InputSize | None:
    read = read_size(record.code)
    if read is not None:
        return read
    try:
        return sizer.measure(record.code)
    except ValueError:  # get_inputs() fails here (e.g. a package the task needs is missing): counted as unmeasured
        return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
    return rows


def _resized_ids(composed: Path) -> set[str] | None:
    """Ids of composed tasks the size bound scaled down; ``None`` without a composed journal."""
    if not composed.exists():
        return None
    return {TaskRecord.from_row(entry["record"]).id for entry in _read_jsonl(composed)
            if "resized_from_bytes" in entry}


def input_size_numbers(sizes: Mapping[str, InputSize | None], bound_mb: float | None,
                       resized: set[str] | None) -> dict[str, Any]:
    """The card's input-size section: buckets, min / median / max, counts over 1 GiB and the bound.

    Args:
        sizes: task id -> measured inputs (``None``: could not be measured).
        bound_mb: the size bound the set was made under; ``None`` when it was not recorded (the
            default bound is then counted against, and the card says so).
        resized: ids of tasks the size bound scaled down (``None``: not recorded).
    """
    mib = sorted(size.nbytes / 2**20 for size in sizes.values() if size is not None)
    labels = [f"< {_SIZE_BUCKETS_MB[0]:g} MiB"] + [f"{low:g} to < {high:g} MiB" for low, high in
                                                  zip(_SIZE_BUCKETS_MB, _SIZE_BUCKETS_MB[1:])]
    labels.append(f">= {_SIZE_BUCKETS_MB[-1]:g} MiB")
    counts = Counter(sum(value >= edge for edge in _SIZE_BUCKETS_MB) for value in mib)
    bound_recorded = bound_mb is not None
    bound_mb = bound_mb if bound_recorded else DEFAULT_MAX_INPUT_MB
    return {
        "bound_mb": bound_mb,
        "bound_recorded": bound_recorded,
        "buckets": [(label, counts.get(index, 0)) for index, label in enumerate(labels)],
        "min_mb": mib[0] if mib else 0.0, "median_mb": statistics.median(mib) if mib else 0.0,
        "max_mb": mib[-1] if mib else 0.0,
        "at_least_1gib": sum(value >= 1024 for value in mib),
        "over_bound": sum(value > bound_mb for value in mib),
        "resized": None if resized is None else len(resized & set(sizes)),
        "unmeasured": sum(size is None for size in sizes.values()),
    }


def diversity_numbers(records: Sequence[TaskRecord], shapes: Mapping[str, Sequence[Sequence[int]]]) -> dict[str, Any]:
    """The card's diversity section: distinct op sequences, the largest, near-duplicate clusters."""
    sequences = op_sequence_counts(records)
    (ops, count), = sequences.most_common(1) or [((), 0)]
    clusters = near_duplicate_clusters(records, shapes)
    return {"op_sequences": len(sequences), "largest_op_sequence": {"ops": list(ops), "tasks": count},
            "clusters": len(clusters), "tasks_in_clusters": sum(len(cluster) for cluster in clusters),
            "largest_cluster": len(clusters[0]) if clusters else 0}


def _coverage(records: Sequence[TaskRecord], catalogue: Path) -> list[dict[str, Any]] | None:
    if not catalogue.exists():
        return None
    from cuda_agent.synth.mining import load_catalogue

    return family_coverage(records, {op.name: op.family for op in load_catalogue(catalogue).ops})


def decontamination_numbers(records: Sequence[TaskRecord], benchmark: Path, withdrawn: Sequence[Any],
                            similarity: float) -> dict[str, Any]:
    """The card's decontamination report, per folder of task files of ``benchmark``.

    Args:
        records: the tasks in the set.
        benchmark: the benchmark folder.
        withdrawn: the journal's ``benchmark_match`` rejections (their detail names the file).
        similarity: the threshold.

    Raises:
        ValueError: ``benchmark`` is not a folder of task files.
    """
    try:
        sources = load_benchmark(benchmark)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    index = BenchmarkIndex.of(sources)
    _, matches = decontaminate(records, index, similarity)
    _, close = decontaminate(records, index, CLOSE_SIMILARITY)
    levels: dict[str, dict[str, int]] = {}
    for name in sources:
        levels.setdefault(_part(name), {"files": 0, "withdrawn": 0, "matches_now": 0, "close": 0})["files"] += 1
    for entry in withdrawn:
        part = _part(entry.detail.split(" ")[0])
        if part in levels:
            levels[part]["withdrawn"] += 1
    for drop in matches:
        levels[_part(drop.matched)]["matches_now"] += 1
    for drop in close:
        if drop.score < similarity:
            levels[_part(drop.matched)]["close"] += 1
    return {"benchmark": str(benchmark), "threshold": similarity, "close_threshold": CLOSE_SIMILARITY,
            "levels": dict(sorted(levels.items()))}


def _part(name: str) -> str:
    """The folder of a benchmark file (``level1`` for ``level1/19_ReLU.py`` and for
    ``KernelBench/level1/19_ReLU.py``), or ``.`` for a file at the top."""
    return name.rsplit("/", 2)[-2] if "/" in name else "."


def read_checks(path: Path, tasks: Mapping[str, tuple[float | None, float | None]],
                window_ms: Sequence[float] | None = None) -> dict[str, Any]:
    """Counts of the set's self-check: per status, ``correct``, the tasks of the set without a
    result, the tasks of the set whose times are the check's, and the failing checks (those of
    tasks still in the set, and those :func:`~cuda_agent.synth.pipeline.apply_checks` withdrew).
    ``path``: the set's ``checks.parquet`` (gathered from several runs, :mod:`checks`), or one
    ``tasks check`` results folder; ``tasks``: the set's ``(eager_ms, compile_ms)`` by task id;
    ``window_ms``: the set's eager-time window, against which the checks' own eager times are
    counted (``outside_window``: the tasks of the set whose check timed them outside it).

    Raises:
        ValueError: ``path`` is neither (the message says why).
    """
    try:
        results = load_checks(path)
    except ValueError as exc:
        raise ValueError(f"--checks: {exc}") from None
    checked = [results[task] for task in tasks if task in results]
    times = check_times(results)
    failing = [{key: row[key] for key in ("task", "status", "error")} for task, row in sorted(results.items())
               if row["status"] != "correct" and (task in tasks or failed(row))]
    return {"path": path.name if path.suffix == ".parquet" else str(path), "checked": len(checked),
            "correct": sum(row["status"] == "correct" for row in checked),
            "statuses": dict(Counter(row["status"] for row in checked)), "not_checked": len(tasks) - len(checked),
            "timed_by_check": sum(times.get(task, ())[:2] == measured for task, measured in tasks.items()),
            "failed": [row for row in failing if row["task"] in tasks],
            "withdrawn": [row for row in failing if row["task"] not in tasks],
            "outside_window": [] if window_ms is None else [
                {"task": task, "eager_ms": times[task][0]} for task in sorted(times)
                if task in tasks and not window_ms[0] <= times[task][0] <= window_ms[1]]}

"""A dataset's self-check results, gathered over several ``tasks check`` runs.

A set of thousands of tasks is judged in pieces (one 10-minute call on one H200 judges ~60), and
a results store is tied to the task list and the folder it ran over. The data folder keeps what
the card and the set need from all of them in one small file, ``checks.parquet``: one row per task
(its latest check), with the verdict's status and error, the four baseline times, sizes, the
verdict's seconds, the device and when. ``tasks check``'s stores are read here; :func:`merge` adds
a run's rows. A set takes its checks in with :func:`cuda_agent.synth.pipeline.apply_checks`: the
tasks whose check says they cannot be judged leave it (:func:`rejection`), the others take the
check's baseline times (:func:`times`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cuda_agent.synth.records import Rejection

CHECKS = "checks.parquet"
COLUMNS = ("task", "status", "error", "eager_ms", "compile_ms", "eager_tf32_on_ms", "compile_tf32_on_ms",
           "input_gb", "output_gb", "verdict_s", "device", "checked_at", "reference_device_gb", "candidate_device_gb")
"""``eager_ms``/``compile_ms``: TF32 off, as the set's own columns; ``device``: the GPU (or CPU) model;
``checked_at``: Unix seconds; ``reference_device_gb``/``candidate_device_gb``: the most device memory
each worker held (GB; None on the CPU, and in rows checked before they were recorded)."""
LATER_COLUMNS = ("reference_device_gb", "candidate_device_gb")
"""Columns added after the first checks files were written: an older file reads them as None."""
RETRIED = frozenset({"infra_error", "harness_error", "out_of_memory"})
"""Statuses that say nothing certain about the task, checked again: the harness or its worker
failed, or the device ran out of memory, which on a GPU shared by several checks another
evaluation's memory can cause (a synthesised task's forward pass is bounded at 4 GB by the
filter, and a check refuses a task that does not fit its share before running it)."""
STAGE = "self_check"
"""The journal stage of a task withdrawn by its check (its reason: the verdict's status)."""


def rows_from_store(path: Path) -> list[dict[str, Any]]:
    """One row per task of a ``tasks check`` results folder (or its ``results.sqlite``).

    Raises:
        ValueError: ``path`` holds no results store, or several runs (the message says which).
    """
    from cuda_agent.evaluate.store import ResultsStore, StoreError

    try:
        store = ResultsStore.open_existing(path)
        try:
            records = store.records(store.run().run_id)
        finally:
            store.close()
    except StoreError as exc:
        raise ValueError(str(exc)) from None
    return [_row(record) for record in records]


def _row(record: Any) -> dict[str, Any]:
    from cuda_agent.evaluate.cli import selfcheck_row

    row = selfcheck_row(record)
    medians = row["baseline_ms"]
    environment = (record.verdict or {}).get("environment") or {}
    return {"task": row["task"], "status": row["status"], "error": row["error"],
            "eager_ms": medians.get("eager_tf32_off"), "compile_ms": medians.get("compile_tf32_off"),
            "eager_tf32_on_ms": medians.get("eager_tf32_on"), "compile_tf32_on_ms": medians.get("compile_tf32_on"),
            "input_gb": row["input_gb"], "output_gb": row["output_gb"], "verdict_s": row["phase_seconds"].get("total"),
            "device": environment.get("gpu") or environment.get("cpu"), "checked_at": row["finished_at"],
            **{f"{worker}_device_gb": _held_gb(row["memory_mb"].get(worker, {})) for worker in ("reference", "candidate")}}


def _held_gb(memory: dict[str, float]) -> float | None:
    held = memory.get("peak_device_reserved_mb", memory.get("peak_device_mb"))
    return None if held is None else held * 2**20 / 1e9


def load(path: Path) -> dict[str, dict[str, Any]]:
    """The rows by task of a ``checks.parquet`` or of one ``tasks check`` results folder (or its
    ``results.sqlite``).

    Raises:
        ValueError: ``path`` is neither (the message names it and says why).
    """
    if path.suffix == ".parquet":
        if not path.is_file():
            raise ValueError(f"{path}: no such file (expected a {CHECKS} written by bench/dataset_check.py merge)")
        return read(path)
    return {row["task"]: row for row in rows_from_store(path)}


def read(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of a ``checks.parquet`` by task; empty when there is no such file.

    Raises:
        ValueError: the file is not a checks file (the message names it and the missing columns).
    """
    if not path.exists():
        return {}
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [column for column in COLUMNS if column not in table.column_names and column not in LATER_COLUMNS]
    if missing:
        raise ValueError(f"{path}: not a checks file (missing columns {', '.join(missing)}; "
                         f"expected {', '.join(COLUMNS)})")
    present = [column for column in COLUMNS if column in table.column_names]
    return {row["task"]: {column: row.get(column) for column in COLUMNS}
            for row in table.select(present).to_pylist()}


def merge(path: Path, rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Add ``rows`` to the checks file at ``path`` (made if absent): a task's later check replaces
    its earlier one. Returns how many rows were added, replaced, and are in the file now."""
    kept = read(path)
    added = replaced = 0
    for row in rows:
        earlier = kept.get(row["task"])
        if earlier is not None and earlier["checked_at"] >= row["checked_at"]:
            continue
        added, replaced = added + (earlier is None), replaced + (earlier is not None)
        kept[row["task"]] = {column: row.get(column) for column in COLUMNS}
    _write(path, kept)
    return {"added": added, "replaced": replaced, "rows": len(kept)}


def forget(path: Path, tasks: Iterable[str]) -> list[str]:
    """Remove the checks of ``tasks`` from the file at ``path``, so that the next check judges
    them again (a check made under conditions since fixed). Returns the tasks that had one."""
    kept = read(path)
    removed = [task for task in dict.fromkeys(tasks) if kept.pop(task, None) is not None]
    if removed:
        _write(path, kept)
    return removed


def _write(path: Path, kept: dict[str, dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([kept[task] for task in sorted(kept)], schema=_schema())
    temporary = path.with_suffix(".parquet.tmp")
    pq.write_table(table, temporary)
    temporary.replace(path)  # a stopped write leaves the previous file whole


def to_check(ids: Sequence[str], checks: dict[str, dict[str, Any]], seed: int = 0, on: str | None = None) -> list[str]:
    """The tasks of ``ids`` without a check that says something about them, in an order drawn with
    ``seed``: a check stopped part-way has then judged a random sample of what was left. With
    ``on`` (part of a GPU model's name, e.g. ``"H100"``), the tasks checked on other GPUs follow,
    in their own drawn order: a set whose check must have run on one model is completed on it
    (a later row replaces the earlier one when merged)."""
    left = [task for task in ids if task not in checks or checks[task]["status"] in RETRIED]
    random.Random(seed).shuffle(left)
    if on is None:
        return left
    elsewhere = [task for task in ids if task in checks and checks[task]["status"] not in RETRIED
                 and on not in (checks[task].get("device") or "")]
    random.Random(seed).shuffle(elsewhere)
    return left + elsewhere


def failed(row: dict[str, Any]) -> bool:
    """The check says the task itself cannot be judged: any status but ``correct`` and those of
    :data:`RETRIED`."""
    return row["status"] != "correct" and row["status"] not in RETRIED


def rejection(row: dict[str, Any]) -> Rejection:
    """The journal entry that withdraws a :func:`failed` task from its set."""
    return Rejection(row["task"], STAGE, row["status"], next(iter((row["error"] or "").splitlines()), ""))


def times(rows: dict[str, dict[str, Any]]) -> dict[str, tuple[float, float, str | None]]:
    """``(eager_ms, compile_ms, device)`` (TF32 off) by task, of the ``correct`` checks that timed
    both: the verdict's protocol on the checking GPU (``device``, its model), which the set's own
    columns then report, so that a set checked on several GPU models says which timed each task."""
    return {task: (row["eager_ms"], row["compile_ms"], row["device"]) for task, row in rows.items()
            if row["status"] == "correct" and row["eager_ms"] is not None and row["compile_ms"] is not None}


def _schema() -> Any:
    import pyarrow as pa

    text, number = pa.string(), pa.float64()
    return pa.schema([(column, text if column in ("task", "status", "error", "device") else number)
                      for column in COLUMNS])


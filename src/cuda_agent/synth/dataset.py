"""The synthesised dataset on disk: a crash-safe journal while the pipeline runs, then Parquet,
JSONL and a dataset card, and the readers for all of them.

A dataset directory holds:

- ``journal.jsonl`` — every decision (accepted row, or rejected id with stage and reason),
  appended and fsync'd once per batch. It is the source of truth: a crash or Ctrl-C loses at most
  the batch being written, and a torn last line is cut off when the directory is reopened.
- ``meta.json`` — the run's :class:`DatasetInfo`, fixed when the directory is created, so that a
  resumed run cannot silently mix settings (device, eager window, torch version).
- ``tasks.parquet`` / ``tasks.jsonl`` — the accepted rows, written by :meth:`DatasetWriter.finalize`
  **sorted by task id**. The id is a content hash of the code, so the order does not depend on
  worker scheduling, batch boundaries or resumption: a resumed run writes byte-identical files.
- ``families.json`` — the operator -> family map the card used; ``README.md`` — the dataset card.

pyarrow is the optional ``parquet`` extra: without it only JSONL is written (the card says so),
and only reading a Parquet file fails.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cuda_agent.synth.records import SEED_OPS_VERSION, TaskRecord

logger = logging.getLogger(__name__)

JOURNAL = "journal.jsonl"
META = "meta.json"
PARQUET = "tasks.parquet"
JSONL = "tasks.jsonl"
FAMILIES = "families.json"
CARD = "README.md"
_INSTALL_PARQUET = "pip install 'cuda-agent[parquet]'"


class DatasetError(ValueError):
    """A dataset file or directory is missing, malformed, or inconsistent with this run."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_STRING = ("string", lambda value: isinstance(value, str), "a string")
# Column -> (arrow type name, check, what the check wants). The dataset card's core columns first, then the
# remaining TaskRecord fields; a TaskRecord field missing here fails the tests, not a run.
_COLUMNS: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "id": _STRING,
    "data_source": _STRING,
    "ops": ("list<string>", lambda value: isinstance(value, list)
            and all(isinstance(item, str) for item in value), "a list of strings"),
    "code": _STRING,
    "eager_ms": ("double", lambda value: value is None or _is_number(value), "a number or null"),
    "compile_ms": ("double", lambda value: value is None or _is_number(value), "a number or null"),
    "device": ("string", lambda value: value is None or isinstance(value, str), "a string or null"),
    "seed_ops_version": _STRING,
    "composer": _STRING,
    "seed": ("int64", lambda value: _is_number(value) and isinstance(value, int), "an integer"),
    "source": _STRING,
}
_REQUIRED = tuple(f.name for f in dataclasses.fields(TaskRecord)
                  if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


@dataclass(frozen=True)
class DatasetInfo:
    """Settings of the run that makes a dataset; stored in ``meta.json`` and shown on the card."""

    device: str
    """Device the execution filter timed on (``cuda``, ``cpu``, or a GPU model name)."""
    eager_window_ms: tuple[float, float]
    """Accepted eager-time window of the filter, ``(low, high)`` in ms (paper: 1-100 on the GPU)."""
    seed_ops_version: str = SEED_OPS_VERSION
    """Seed catalogue version every accepted task must carry."""
    torch_version: str = field(default_factory=lambda: torch.__version__)
    """torch that timed the tasks; timings from different versions are not comparable."""

    def __post_init__(self) -> None:
        low, high = self.eager_window_ms
        if not 0 <= low < high:
            raise ValueError(f"eager_window_ms must be (low, high) with 0 <= low < high, "
                             f"got {self.eager_window_ms!r}")
        if not self.device:
            raise ValueError("device must name the device the tasks were timed on, got ''")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["eager_window_ms"] = list(self.eager_window_ms)
        return data


@dataclass(frozen=True)
class Rejection:
    """One task id the pipeline turned down, and why (a funnel entry of the card)."""

    id: str
    stage: str
    """Pipeline stage that rejected it (``filter``, ``decontaminate``, ...)."""
    reason: str
    """Named, countable reason (``not_deterministic``, ``benchmark_match``, ...)."""
    detail: str = ""
    """Free text for humans (the matched benchmark file, an error line); never counted."""


def _row(record: TaskRecord) -> dict[str, Any]:
    row = record.to_row()
    return {column: row[column] for column in _COLUMNS}


def _record(row: Any, origin: str) -> TaskRecord:
    """Check one stored row against the schema and rebuild its record.

    Raises:
        DatasetError: naming ``origin`` and the missing or invalid column.
    """
    if not isinstance(row, dict):
        raise DatasetError(f"{origin}: expected an object of columns, got {type(row).__name__}")
    missing = [column for column in _REQUIRED if column not in row]
    if missing:
        raise DatasetError(f"{origin}: missing column(s) {', '.join(missing)} "
                           f"(required: {', '.join(_REQUIRED)})")
    for column, (_, check, wanted) in _COLUMNS.items():
        if column in row and not check(row[column]):
            raise DatasetError(f"{origin}: column {column!r} must be {wanted}, "
                               f"got {row[column]!r:.80}")
    record = TaskRecord.from_row(row)
    if "id" in row and row["id"] != record.id:
        raise DatasetError(f"{origin}: column 'id' is {row['id']!r} but the code hashes to "
                           f"{record.id!r}; ids are content addresses, so the code was changed")
    return record


def _fsync_write(path: Path, data: bytes) -> None:
    """Write a whole file atomically (temporary file, fsync, rename): readers never see half."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: invalid JSON ({exc.msg})") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("created"), str)
            and isinstance(meta.get("info"), dict)):
        raise DatasetError(f"{path}: expected {{'created': time, 'info': settings}}")
    return meta


def _read_journal(path: Path) -> tuple[list[TaskRecord], list[Rejection]]:
    """Replay the journal; a torn last line (a crash mid-write) is cut off the file."""
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        logger.warning("%s: dropping a torn last line (%d bytes) left by an interrupted write",
                       path, len(data) - len(complete))
        with open(path, "r+b") as handle:
            handle.truncate(len(complete))
            os.fsync(handle.fileno())
    accepted, rejected = [], []
    for number, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
        origin = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{origin}: invalid JSON ({exc.msg}); the journal is corrupt") from None
        if isinstance(entry, dict) and "accepted" in entry:
            accepted.append(_record(entry["accepted"], origin))
        elif isinstance(entry, dict) and isinstance(entry.get("rejected"), dict):
            try:
                rejection = Rejection(**entry["rejected"])
            except TypeError as exc:
                raise DatasetError(f"{origin}: invalid rejection entry ({exc})") from None
            if _withdraws(rejection, accepted):
                accepted = [record for record in accepted if record.id != rejection.id]
            rejected.append(rejection)
        else:
            raise DatasetError(f"{origin}: expected {{'accepted': row}} or {{'rejected': ...}}")
    return accepted, rejected


def _withdraws(rejection: Rejection, accepted: Iterable[TaskRecord]) -> bool:
    """A de-contamination drop of a task accepted earlier: a benchmark given when a run is resumed
    applies to the whole dataset, so that task leaves it."""
    return rejection.stage == "decontaminate" and any(record.id == rejection.id for record in accepted)


class DatasetWriter:
    """Appends pipeline decisions to a dataset directory's journal and finalizes the dataset.

    Use :meth:`open`; it resumes an existing directory. Each id is decided once: later decisions
    for an id already in the journal are ignored, so re-feeding a batch after a crash is harmless.
    The one exception is de-contamination, which also withdraws tasks accepted before a benchmark
    was given.
    """

    def __init__(self, directory: Path, info: DatasetInfo, created: str,
                 accepted: list[TaskRecord], rejected: list[Rejection]):
        self.directory = directory
        self.info = info
        self.created = created
        """UTC time the directory was created (ISO 8601); the card's date."""
        self._accepted = accepted
        self._rejected = rejected
        self._decided = {record.id for record in accepted} | {entry.id for entry in rejected}
        self._journal = open(directory / JOURNAL, "ab")

    @classmethod
    def open(cls, directory: str | Path, info: DatasetInfo) -> DatasetWriter:
        """Create a dataset directory, or reopen one to resume it.

        Raises:
            DatasetError: the directory was started with different settings, or its journal is
                corrupt (the message names the file and line).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta_path, journal_path = directory / META, directory / JOURNAL
        if meta_path.exists():
            meta = _read_meta(meta_path)
            stored = meta["info"]
            changed = {key: (stored.get(key), value) for key, value in info.to_dict().items()
                       if stored.get(key) != value}
            if changed:
                listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed.items())
                raise DatasetError(f"{directory}: the run that started this dataset used other "
                                   f"settings ({listed}); resume with the same settings or use "
                                   "a new directory")
            created = meta["created"]
        elif journal_path.exists() and journal_path.stat().st_size:
            raise DatasetError(f"{directory}: {JOURNAL} exists without {META}; "
                               "this is not a directory made by DatasetWriter")
        else:
            created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            meta = {"created": created, "info": info.to_dict()}
            _fsync_write(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
        accepted, rejected = _read_journal(journal_path) if journal_path.exists() else ([], [])
        if accepted or rejected:
            logger.info("resuming %s: %d accepted, %d rejected", directory, len(accepted),
                        len(rejected))
        return cls(directory, info, created, accepted, rejected)

    @classmethod
    def reopen(cls, directory: str | Path) -> DatasetWriter:
        """Reopen an existing dataset with the settings it was made with, for a stage that measures
        nothing (de-contamination), so it may run on another machine or torch.

        Raises:
            DatasetError: ``directory`` is not a dataset made by DatasetWriter.
        """
        meta_path = Path(directory) / META
        if not meta_path.exists():
            raise DatasetError(f"{directory}: no {META}; not a dataset directory made by `cuda-agent synth`")
        stored = dict(_read_meta(meta_path)["info"])
        try:
            info = DatasetInfo(**{**stored, "eager_window_ms": tuple(stored["eager_window_ms"])})
        except (TypeError, KeyError, ValueError) as exc:
            raise DatasetError(f"{meta_path}: invalid settings ({exc})") from None
        return cls.open(directory, info)

    def families(self) -> dict[str, str] | None:
        """Operator -> family as the last :meth:`finalize` stored it (``None`` if it had none)."""
        return _stored_families(self.directory)

    @property
    def decided(self) -> frozenset[str]:
        """Ids already accepted or rejected: the pipeline skips them."""
        return frozenset(self._decided)

    @property
    def accepted(self) -> list[TaskRecord]:
        """Accepted records in journal order (e.g. to de-duplicate a new batch against)."""
        return list(self._accepted)

    def append(self, accepted: Iterable[TaskRecord] = (), rejected: Iterable[Rejection] = ()) -> None:
        """Record one batch of decisions durably (one write and one fsync for the batch).

        Raises:
            ValueError: an accepted record was made from another seed catalogue than the run's.
        """
        accepted = list(accepted)
        for record in accepted:
            if record.seed_ops_version != self.info.seed_ops_version:
                raise ValueError(f"task {record.id}: seed_ops_version {record.seed_ops_version!r}"
                                 f" differs from the dataset's {self.info.seed_ops_version!r}")
        lines = []
        for record in accepted:
            if record.id not in self._decided:
                self._decided.add(record.id)
                self._accepted.append(record)
                lines.append({"accepted": _row(record)})
        for entry in rejected:
            withdrawn = _withdraws(entry, self._accepted)
            if withdrawn:
                self._accepted = [record for record in self._accepted if record.id != entry.id]
            if withdrawn or entry.id not in self._decided:
                self._decided.add(entry.id)
                self._rejected.append(entry)
                lines.append({"rejected": dataclasses.asdict(entry)})
        if lines:
            self._journal.write(b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n"
                                         for line in lines))
            self._journal.flush()
            os.fsync(self._journal.fileno())

    def finalize(self, families: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Write ``tasks.parquet`` (when pyarrow is installed), ``tasks.jsonl`` and the card.

        Args:
            families: Operator name -> family (e.g. from the seed catalogue), for the card's
                per-family counts; operators it lacks count as ``unknown``.

        Returns:
            The card's numbers, as :func:`stats` returns them.
        """
        rows = [_row(record) for record in sorted(self._accepted, key=lambda r: r.id)]
        files = [JSONL]
        try:
            _write_parquet(rows, self.directory / PARQUET)
            files.insert(0, PARQUET)
        except ImportError:
            logger.warning("pyarrow is not installed: writing %s only (%s)", JSONL, _INSTALL_PARQUET)
            (self.directory / PARQUET).unlink(missing_ok=True)  # a stale one would disagree
        _fsync_write(self.directory / JSONL, "".join(
            json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode())
        if families is None:
            (self.directory / FAMILIES).unlink(missing_ok=True)
        else:
            used = sorted({op for record in self._accepted for op in record.ops if op in families})
            _fsync_write(self.directory / FAMILIES,
                         (json.dumps({op: families[op] for op in used}, indent=2) + "\n").encode())
        numbers = _stats(self._accepted, self._rejected, self._meta(), families, files)
        _fsync_write(self.directory / CARD, render_card(numbers).encode())
        logger.info("wrote %d tasks to %s", len(rows), self.directory)
        return numbers

    def _meta(self) -> dict[str, Any]:
        return {"created": self.created, **self.info.to_dict()}

    def close(self) -> None:
        self._journal.close()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"string": pa.string(), "double": pa.float64(), "int64": pa.int64(),
             "list<string>": pa.list_(pa.string())}
    schema = pa.schema([(column, types[kind]) for column, (kind, _, _) in _COLUMNS.items()])
    temporary = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), temporary)
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _read_parquet(path: Path) -> list[TaskRecord]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow; install it with "
                           f"{_INSTALL_PARQUET}, or read {JSONL}") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for corrupt files
        raise DatasetError(f"{path}: cannot read Parquet file ({exc})") from None
    missing = [column for column in _REQUIRED if column not in table.column_names]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {', '.join(missing)} "
                           f"(has: {', '.join(table.column_names)})")
    return [_record(row, f"{path} row {index}") for index, row in enumerate(table.to_pylist())]


def _read_jsonl(path: Path) -> list[TaskRecord]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
            records.append(_record(row, f"{path}:{number}"))
    return records


def read_dataset(path: str | Path) -> list[TaskRecord]:
    """Read tasks back from ``tasks.parquet``, ``tasks.jsonl``, or a dataset directory (Parquet
    when pyarrow is installed, else JSONL).

    Raises:
        DatasetError: the path does not exist, holds no dataset file, or a row is invalid (the
            message names the file, the row and the column).
    """
    path = Path(path)
    if path.is_dir():
        candidates = [path / PARQUET, path / JSONL]
        if _pyarrow_missing():
            candidates.reverse()
        found = next((candidate for candidate in candidates if candidate.exists()), None)
        if found is None:
            raise DatasetError(f"{path}: no {PARQUET} or {JSONL}; if a run wrote {JOURNAL}, "
                               "finish it (DatasetWriter.finalize) first")
        path = found
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    raise DatasetError(f"{path}: expected a .parquet or .jsonl file or a dataset directory")


def _pyarrow_missing() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return True
    return False


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _stats(accepted: list[TaskRecord], rejected: list[Rejection], meta: Mapping[str, Any],
           families: Mapping[str, str] | None, files: list[str]) -> dict[str, Any]:
    funnel: dict[str, Counter[str]] = {}
    for entry in rejected:
        funnel.setdefault(entry.stage, Counter())[entry.reason] += 1
    per_family: Counter[str] = Counter()
    if families is not None:
        for record in accepted:
            per_family.update({families.get(op, "unknown") for op in record.ops})
    return {
        "tasks": len(accepted),
        "files": files,
        "ops_per_task": dict(sorted(Counter(len(record.ops) for record in accepted).items())),
        "tasks_per_family": dict(sorted(per_family.items(), key=lambda item: (-item[1], item[0]))),
        "decided": len(accepted) + len(rejected),
        "rejected": {stage: dict(sorted(reasons.items())) for stage, reasons in funnel.items()},
        "eager_ms": _summary([r.eager_ms for r in accepted if r.eager_ms is not None]),
        "compile_ms": _summary([r.compile_ms for r in accepted if r.compile_ms is not None]),
        "devices": dict(sorted(Counter(str(record.device) for record in accepted).items())),
        "composers": dict(sorted(Counter(record.composer for record in accepted).items())),
        "run": dict(meta),
    }


def stats(path: str | Path, families: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The dataset card's numbers for a dataset directory (finished or still running) or file.

    The journal, when present, is the source (it also holds the rejections); else the data file.

    Args:
        path: Dataset directory, ``tasks.parquet`` or ``tasks.jsonl``.
        families: Operator -> family map; defaults to the ``families.json`` that finalize wrote.

    Returns:
        ``tasks``, ``files``, ``ops_per_task`` ({number of fused ops: tasks}),
        ``tasks_per_family`` ({family: tasks with at least one such op}, empty without a map),
        ``decided``, ``rejected`` ({stage: {reason: count}}), ``eager_ms`` / ``compile_ms``
        (min, median, max over accepted tasks), ``devices``, ``run`` (``meta.json``: settings,
        torch version, creation time; empty for a bare data file).

    Raises:
        DatasetError: as :func:`read_dataset`, or a corrupt journal.
    """
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    if (directory / JOURNAL).exists():
        accepted, rejected = _read_journal(directory / JOURNAL)
    else:
        accepted, rejected = read_dataset(path), []
    if families is None:
        families = _stored_families(directory)
    meta = {}
    if (directory / META).exists():
        stored = _read_meta(directory / META)
        meta = {"created": stored["created"], **stored["info"]}
    files = [name for name in (PARQUET, JSONL) if (directory / name).exists()]
    return _stats(accepted, rejected, meta, families, files)


def write_sample(source: str | Path, n: int, out_dir: str | Path) -> dict[str, Any]:
    """Write a stratified sample of a finished dataset (for tests and demos): ``tasks.parquet``
    and a card naming the source.

    The sample takes equal shares per number of fused ops (a short share's remainder goes to the
    others), each share the first tasks in ``id`` order: ids are content hashes, so the choice is
    deterministic and unrelated to what a task computes.

    Returns:
        The sample card's numbers (as :func:`stats`, plus ``sample_of``).

    Raises:
        DatasetError: ``source`` is unreadable, or ``n`` is not in 1..its number of tasks.
    """
    source = Path(source)
    records = read_dataset(source)
    if not 1 <= n <= len(records):
        raise DatasetError(f"sample size must be between 1 and the {len(records)} tasks of {source}, got {n}")
    strata: dict[int, list[TaskRecord]] = {}
    for record in sorted(records, key=lambda r: r.id):
        strata.setdefault(len(record.ops), []).append(record)
    picked: list[TaskRecord] = []
    depth = 0
    while len(picked) < n:
        picked += [share[depth] for _, share in sorted(strata.items()) if depth < len(share)][:n - len(picked)]
        depth += 1
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [_row(record) for record in sorted(picked, key=lambda r: r.id)]
    _write_parquet(rows, out_dir / PARQUET)
    source_numbers = stats(source)
    numbers = _stats(picked, [], source_numbers["run"], _stored_families(source), [PARQUET])
    numbers["sample_of"] = {"path": str(source), "tasks": len(records)}
    _fsync_write(out_dir / CARD, render_card(numbers).encode())
    return numbers


def _stored_families(path: Path) -> dict[str, str] | None:
    """The operator -> family map :meth:`DatasetWriter.finalize` stored next to a dataset, if any."""
    directory = path if path.is_dir() else path.parent
    if not (directory / FAMILIES).exists():
        return None
    try:
        families = json.loads((directory / FAMILIES).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DatasetError(f"{directory / FAMILIES}: invalid JSON ({exc})") from None
    if not isinstance(families, dict):
        raise DatasetError(f"{directory / FAMILIES}: expected a JSON object of operator -> family")
    return families


def _table(header: tuple[str, str], rows: Iterable[tuple[Any, Any]]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---:|"]
    lines += [f"| {key} | {value} |" for key, value in rows]
    return "\n".join(lines)


def _ms(summary: Mapping[str, float]) -> str:
    if not summary:
        return "not measured"
    return " / ".join(f"{summary[key]:.4g}" for key in ("min", "median", "max")) + " ms"


def provenance_section(composers: Mapping[str, int]) -> str:
    """The card's section on columns, composers and how the set differs from CUDA-Agent-Ops-6K."""
    used = ", ".join(f"`{name}` {count}" for name, count in composers.items()) or "unknown"
    return f"""## Columns and differences from CUDA-Agent-Ops-6K

Composer of the tasks: {used} (`deterministic`: cuda-agent's seeded, shape-aware composer, no
LLM; `llm:<model>`: an LLM composing the operators that composer sampled). The paper's Ops-6K was composed
by an LLM.

- `data_source` is `<seed source>#<number of fused operators>` (`torch#3`, `transformers#5`), the
  Ops-6K convention; many rows share a value, so it is not an id. `id` is the content hash of
  `code`; `ops`, `code` as in Ops-6K; `eager_ms`, `compile_ms`, `device`, `seed_ops_version`,
  `composer`, `seed`, `source` are ours.
- Filter: eager and `torch.compile` must run, be deterministic and not degenerate, with the eager
  time inside the window above (the paper's window on CUDA is 1-100 ms), and near-copies of
  KernelBench problems are withdrawn, as in the paper; the thresholds are cuda-agent's own.
- `cuda-agent tasks list FILE --failed` lists rows that fail to load and why; loaders key rows by
  `id` (row index where a table has no `id`, as Ops-6K has none).
"""


def render_card(numbers: Mapping[str, Any]) -> str:
    """The dataset card (``README.md``) for the numbers :func:`stats` returns."""
    run = numbers["run"]
    window = run.get("eager_window_ms")
    parquet_note = ("" if PARQUET in numbers["files"] else
                    f"\n`{PARQUET}` was not written: pyarrow is not installed ({_INSTALL_PARQUET}).\n")
    if numbers["tasks_per_family"]:
        families = _table(("family", "tasks"), numbers["tasks_per_family"].items())
        families += "\n\nA task counts once in every family it has an operator of."
    else:
        families = "No operator -> family map was given."
    funnel = [(f"{stage}: {reason}", count) for stage, reasons in numbers["rejected"].items()
              for reason, count in reasons.items()]
    if "sample_of" in numbers:
        source = numbers["sample_of"]
        decisions = (f"A sample of {numbers['tasks']} of the {source['tasks']} tasks of `{source['path']}`: "
                     "equal shares per number of fused ops, each share the first tasks in `id` order (content-hash "
                     "order, so deterministic and unrelated to the task). The source's card has its filter funnel.")
    else:
        decisions = (f"{numbers['decided']} tasks decided, {numbers['tasks']} accepted.\n\n"
                     + _table(('stage: reason', 'rejected'), funnel))
    return f"""# Synthesised CUDA kernel tasks

{numbers['tasks']} tasks in KernelBench format (`class Model`, `get_inputs`, `get_init_inputs`),
composed from seed operators and kept after the execution filter, de-contamination and
de-duplication by `cuda-agent synth`. Files: {', '.join(f'`{name}`' for name in numbers['files'])}
(the same rows, sorted by `id`, the content hash of `code`).
{parquet_note}
| setting | value |
|---|---|
| device | {run.get('device', 'unknown')} |
| eager time window | {f'{window[0]:g} - {window[1]:g} ms' if window else 'unknown'} |
| eager time (min / median / max) | {_ms(numbers['eager_ms'])} |
| torch.compile time (min / median / max) | {_ms(numbers['compile_ms'])} |
| seed_ops_version | {run.get('seed_ops_version', 'unknown')} |
| torch | {run.get('torch_version', 'unknown')} |
| created | {run.get('created', 'unknown')} |

## Fused operators per task

{_table(('ops', 'tasks'), numbers['ops_per_task'].items())}

## Operator families

{families}

## Filter funnel

{decisions}
{provenance_section(numbers.get('composers') or {})}"""

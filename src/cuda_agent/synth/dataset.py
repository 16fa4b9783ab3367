"""The synthesised dataset on disk: a crash-safe journal while the pipeline runs, then Parquet,
JSONL and a dataset card, and the readers for all of them.

A dataset directory holds:

- ``journal.jsonl`` — every decision (accepted row, or rejected id with stage and reason; later,
  a task's baseline times measured again by its self-check), appended and fsync'd once per batch.
  It is the source of truth: a crash or Ctrl-C loses at most the batch being written, and a torn
  last line is cut off when the directory is reopened.
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cuda_agent.synth.card import INSTALL_PARQUET, PARQUET, card_numbers, render_card
from cuda_agent.synth.diversity import DEFAULT_MAX_OP_SEQUENCE_SHARE, cap_op_sequences
from cuda_agent.synth.input_size import DEFAULT_MAX_INPUT_MB
from cuda_agent.synth.records import SEED_OPS_VERSION, Rejection, TaskRecord

logger = logging.getLogger(__name__)

JOURNAL = "journal.jsonl"
META = "meta.json"
JSONL = "tasks.jsonl"
FAMILIES = "families.json"
CARD = "README.md"
COMPOSED = "composed.jsonl"
"""Every composed task (or the composer's failure) of a run, bounded, before screening."""
RUNS = "runs.jsonl"
"""One line per ``synth run`` call: its command, settings, machine and counts."""


class DatasetError(ValueError):
    """A dataset file or directory is missing, malformed, or inconsistent with this run."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


Timing = tuple[float, float, "str | None"]
"""A task's new ``(eager_ms, compile_ms, device)``: ``device`` names what timed it (a GPU model), or
is ``None`` where that is not known (entries journaled before it was), which keeps the record's."""


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
    max_input_mb: float = DEFAULT_MAX_INPUT_MB
    """The size bound: no task's inputs exceed this many MiB (:mod:`cuda_agent.synth.input_size`)."""
    max_op_sequence_share: float = DEFAULT_MAX_OP_SEQUENCE_SHARE
    """Most of the dataset one operator sequence may hold (:mod:`cuda_agent.synth.diversity`)."""

    def __post_init__(self) -> None:
        low, high = self.eager_window_ms
        if not 0 <= low < high:
            raise ValueError(f"eager_window_ms must be (low, high) with 0 <= low < high, "
                             f"got {self.eager_window_ms!r}")
        if not self.device:
            raise ValueError("device must name the device the tasks were timed on, got ''")
        if not self.max_input_mb > 0:
            raise ValueError(f"max_input_mb must be > 0, got {self.max_input_mb!r}")
        if not 0 < self.max_op_sequence_share <= 1:
            raise ValueError(f"max_op_sequence_share must be in (0, 1], got {self.max_op_sequence_share!r}")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["eager_window_ms"] = list(self.eager_window_ms)
        return data


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


def read_journal(path: Path) -> tuple[list[TaskRecord], list[Rejection]]:
    """Replay a ``journal.jsonl``: the accepted tasks (withdrawals and new times applied) and every
    rejection. A torn last line (a crash mid-write) is cut off the file.

    Raises:
        DatasetError: a line is not a decision (naming the file and line).
    """
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        logger.warning("%s: dropping a torn last line (%d bytes) left by an interrupted write",
                       path, len(data) - len(complete))
        with open(path, "r+b") as handle:
            handle.truncate(len(complete))
            os.fsync(handle.fileno())
    accepted, rejected = [], []
    times: dict[str, Timing] = {}  # the latest retimed entry of each task
    for number, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
        origin = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{origin}: invalid JSON ({exc.msg}); the journal is corrupt") from None
        if isinstance(entry, dict) and "accepted" in entry:
            accepted.append(_record(entry["accepted"], origin))
        elif isinstance(entry, dict) and isinstance(entry.get("retimed"), dict):
            times[entry["retimed"].get("id")] = _times(entry["retimed"], origin)
        elif isinstance(entry, dict) and isinstance(entry.get("rejected"), dict):
            try:
                rejection = Rejection(**entry["rejected"])
            except TypeError as exc:
                raise DatasetError(f"{origin}: invalid rejection entry ({exc})") from None
            if _withdraws(rejection, accepted):
                accepted = [record for record in accepted if record.id != rejection.id]
            rejected.append(rejection)
        else:
            raise DatasetError(f"{origin}: expected {{'accepted': row}}, {{'rejected': ...}} or {{'retimed': ...}}")
    accepted = [_retimed(record, times[record.id]) if record.id in times else record for record in accepted]
    return accepted, rejected


WITHDRAWING_STAGES = frozenset({"decontaminate", "self_check"})
"""Stages whose rejection also removes a task accepted earlier: a benchmark given when a run is
resumed applies to the whole dataset, and so does a task's self-check (``synth/checks.py``)."""


def _withdraws(rejection: Rejection, accepted: Iterable[TaskRecord]) -> bool:
    return rejection.stage in WITHDRAWING_STAGES and any(record.id == rejection.id for record in accepted)


def _times(entry: Mapping[str, Any], origin: str) -> Timing:
    """The :data:`Timing` of a ``retimed`` entry (see :meth:`DatasetWriter.retime`)."""
    device = entry.get("device")
    if not (isinstance(entry.get("id"), str) and _is_number(entry.get("eager_ms"))
            and _is_number(entry.get("compile_ms")) and (device is None or isinstance(device, str))):
        raise DatasetError(f"{origin}: invalid retimed entry (expected id, eager_ms and compile_ms, "
                           "and device as a string where given)")
    return entry["eager_ms"], entry["compile_ms"], device


def _retimed(record: TaskRecord, timing: Timing) -> TaskRecord:
    eager_ms, compile_ms, device = timing
    return dataclasses.replace(record, eager_ms=eager_ms, compile_ms=compile_ms, device=device or record.device)


class DatasetWriter:
    """Appends pipeline decisions to a dataset directory's journal and finalizes the dataset.

    Use :meth:`open`; it resumes an existing directory. Each id is decided once: later decisions
    for an id already in the journal are ignored, so re-feeding a batch after a crash is harmless.
    The exceptions are the :data:`WITHDRAWING_STAGES` (de-contamination, the self-check), which
    also withdraw tasks accepted earlier.
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
            changed = {key: (stored[key], value) for key, value in info.to_dict().items()
                       if key in stored and stored[key] != value}
            if changed:
                listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed.items())
                raise DatasetError(f"{directory}: the run that started this dataset used other "
                                   f"settings ({listed}); resume with the same settings or use "
                                   "a new directory")
            added = sorted(set(info.to_dict()) - set(stored))
            if added:  # settings this version records and the run that made the directory did not
                logger.info("%s: recording the settings %s, which its meta.json predates", directory, added)
                meta = {"created": meta["created"], "info": info.to_dict()}
                _fsync_write(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
            created = meta["created"]
        elif journal_path.exists() and journal_path.stat().st_size:
            raise DatasetError(f"{directory}: {JOURNAL} exists without {META}; "
                               "this is not a directory made by DatasetWriter")
        else:
            created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            meta = {"created": created, "info": info.to_dict()}
            _fsync_write(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
        accepted, rejected = read_journal(journal_path) if journal_path.exists() else ([], [])
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
        if not (Path(directory) / JOURNAL).exists():
            raise DatasetError(f"{directory}: no {JOURNAL}, the decisions the dataset is rewritten from; a published "
                               "copy without its journal cannot be changed in place (work on the run's directory)")
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

    def append(self, accepted: Iterable[TaskRecord] = (), rejected: Iterable[Rejection] = (),
               note: Mapping[str, Any] | None = None) -> None:
        """Record one batch of decisions durably (one write and one fsync for the batch).

        ``note`` is stored beside each of the batch's decisions (e.g. ``{"lane": "cuda:1/3"}``, the
        filter lane that decided it); reading the journal back ignores it.

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
                lines.append({"accepted": _row(record), **(note or {})})
        for entry in rejected:
            withdrawn = _withdraws(entry, self._accepted)
            if withdrawn:
                self._accepted = [record for record in self._accepted if record.id != entry.id]
            if withdrawn or entry.id not in self._decided:
                self._decided.add(entry.id)
                self._rejected.append(entry)
                lines.append({"rejected": dataclasses.asdict(entry), **(note or {})})
        self._write(lines)

    def _write(self, lines: list[dict[str, Any]]) -> None:
        """Append journal lines with one write and one fsync."""
        if lines:
            self._journal.write(b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n"
                                         for line in lines))
            self._journal.flush()
            os.fsync(self._journal.fileno())

    def retime(self, times: Mapping[str, Timing]) -> int:
        """Journal a new :data:`Timing` for accepted tasks (e.g. from their self-check), so that
        every later :meth:`finalize` writes it: the times and the device that measured them. Returns
        how many tasks changed: a timing equal to the stored one adds nothing, so applying the same
        checks again is free."""
        lines, by_id = [], {record.id: index for index, record in enumerate(self._accepted)}
        for task, timing in times.items():
            index = by_id.get(task)
            if index is None:
                continue
            retimed = _retimed(self._accepted[index], timing)
            if retimed == self._accepted[index]:
                continue
            self._accepted[index] = retimed
            lines.append({"retimed": {"id": task, "eager_ms": retimed.eager_ms, "compile_ms": retimed.compile_ms,
                                      "device": retimed.device}})
        self._write(lines)
        return len(lines)

    def finalize(self, families: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Write ``tasks.parquet`` (when pyarrow is installed), ``tasks.jsonl`` and the card.

        The files hold the accepted tasks under the op-sequence cap
        (:attr:`DatasetInfo.max_op_sequence_share`); the journal keeps every decision.

        Args:
            families: Operator name -> family (e.g. from the seed catalogue), for the card's
                per-family counts; operators it lacks count as ``unknown``.

        Returns:
            The card's numbers, as :func:`stats` returns them.
        """
        published, capped = cap_op_sequences(self._accepted, self.info.max_op_sequence_share)
        rows = [_row(record) for record in sorted(published, key=lambda r: r.id)]
        files = [JSONL]
        try:
            _write_parquet(rows, self.directory / PARQUET)
            files.insert(0, PARQUET)
        except ImportError:
            logger.warning("pyarrow is not installed: writing %s only (%s)", JSONL, INSTALL_PARQUET)
            (self.directory / PARQUET).unlink(missing_ok=True)  # a stale one would disagree
        _fsync_write(self.directory / JSONL, "".join(
            json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode())
        if families is None:
            (self.directory / FAMILIES).unlink(missing_ok=True)
        else:
            used = sorted({op for record in published for op in record.ops if op in families})
            _fsync_write(self.directory / FAMILIES,
                         (json.dumps({op: families[op] for op in used}, indent=2) + "\n").encode())
        numbers = card_numbers(published, self._rejected, self._meta(), families, files, len(capped))
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
                           f"{INSTALL_PARQUET}, or read {JSONL}") from None
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


def stats(path: str | Path, families: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The dataset card's numbers for a dataset directory (finished or still running) or file.

    The journal, when present, is the source (it also holds the rejections); else the data file.

    Args:
        path: Dataset directory, ``tasks.parquet`` or ``tasks.jsonl``.
        families: Operator -> family map; defaults to the ``families.json`` that finalize wrote.

    Returns:
        ``tasks``, ``files``, ``ops_per_task`` ({number of fused ops: tasks}),
        ``tasks_per_family`` ({family: tasks with at least one such op}, empty without a map),
        ``decided``, ``rejected`` ({stage: {reason: count}}), ``capped`` (accepted tasks the
        op-sequence cap leaves out), ``eager_ms`` / ``compile_ms`` (min, median, max over the
        set), ``devices``, ``composers``, ``transformers`` (tasks whose source is transformers),
        ``journaled``, ``run`` (``meta.json``: settings, torch version, creation time; empty for a
        bare data file): see :func:`cuda_agent.synth.card.card_numbers`.

    Raises:
        DatasetError: as :func:`read_dataset`, or a corrupt journal.
    """
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    journaled = (directory / JOURNAL).exists()
    if journaled:
        accepted, rejected = read_journal(directory / JOURNAL)
    else:
        accepted, rejected = read_dataset(path), []
    if families is None:
        families = _stored_families(directory)
    meta = {}
    if (directory / META).exists():
        stored = _read_meta(directory / META)
        meta = {"created": stored["created"], **stored["info"]}
    capped: list[TaskRecord] = []
    if journaled and "max_op_sequence_share" in meta:  # the files hold the capped set: count as they do
        accepted, capped = cap_op_sequences(accepted, meta["max_op_sequence_share"])
    files = [name for name in (PARQUET, JSONL) if (directory / name).exists()]
    return card_numbers(accepted, rejected, meta, families, files, len(capped), journaled)


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
    numbers = card_numbers(picked, [], source_numbers["run"], _stored_families(source), [PARQUET])
    # named from the sample's folder, so the card points at its source wherever the two are copied
    numbers["sample_of"] = {"path": os.path.relpath(source.resolve(), out_dir.resolve()), "tasks": len(records)}
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

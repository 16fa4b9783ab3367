"""Dataset writer and reader: round trips, resumption after a crash, the card, and bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cuda_agent.environment.task import load_tasks
from cuda_agent.synth.dataset import (CARD, JOURNAL, JSONL, PARQUET, DatasetError, DatasetInfo,
                                      DatasetWriter, Rejection, read_dataset, stats)
from cuda_agent.synth import dataset
from cuda_agent.synth.records import TaskRecord

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
OPS = {"add_relu_mul.py": ["torch.add", "torch.relu", "torch.mul"], "matmul.py": ["torch.matmul"],
       "relu.py": ["torch.relu"], "rmsnorm.py": ["torch.rsqrt", "torch.mean", "torch.mul"],
       "row_sum.py": ["torch.sum"], "softmax.py": ["torch.softmax"]}
FAMILIES = {"torch.add": "elementwise", "torch.mul": "elementwise", "torch.relu": "activation",
            "torch.matmul": "linear", "torch.rsqrt": "elementwise", "torch.mean": "reduction",
            "torch.sum": "reduction"}
INFO = DatasetInfo(device="cpu", eager_window_ms=(0.1, 100.0), max_op_sequence_share=1.0)  # pairs share ops


def make_records() -> list[TaskRecord]:
    """Twelve distinct tasks: each example task at two sizes (different code, so different ids)."""
    records = []
    for seed, path in enumerate(sorted(EXAMPLE_TASKS.glob("*.py")) * 2):
        code = path.read_text() + (f"\n# variant {seed}\n" if seed >= 6 else "")
        records.append(TaskRecord(code=code, ops=OPS[path.name], composer="deterministic", seed=seed,
                                  eager_ms=0.5 + seed, compile_ms=0.25 + seed, device="cpu"))
    return records


REASONS = [("filter", "not_deterministic"), ("filter", "eager_time_out_of_window"),
           ("decontaminate", "benchmark_match"), ("filter", "not_deterministic")]


def rejections(records: list[TaskRecord]) -> list[Rejection]:
    """One rejected task per record (another id), its reason fixed by the record's seed."""
    return [Rejection(record.id + "x", *REASONS[record.seed % len(REASONS)]) for record in records]


def run_uninterrupted(directory: Path) -> dict:
    records = make_records()
    with DatasetWriter.open(directory, INFO) as writer:
        for start in range(0, len(records), 3):
            writer.append(records[start:start + 3], rejections(records[start:start + 3]))
        return writer.finalize(FAMILIES)


def test_round_trip_through_parquet_jsonl_and_directory(tmp_path: Path) -> None:
    run_uninterrupted(tmp_path)
    expected = sorted(make_records(), key=lambda record: record.id)
    for source in (tmp_path, tmp_path / PARQUET, tmp_path / JSONL):
        assert read_dataset(source) == expected
    first = json.loads((tmp_path / JSONL).read_text().splitlines()[0])
    assert list(first)[:8] == ["id", "data_source", "ops", "code", "eager_ms", "compile_ms", "device",
                               "seed_ops_version"]
    assert first["data_source"] == f"torch#{len(first['ops'])}"


def test_written_parquet_loads_as_environment_tasks(tmp_path: Path) -> None:
    run_uninterrupted(tmp_path)
    results = load_tasks(tmp_path / PARQUET)
    assert [r.task.id for r in results] == sorted(record.id for record in make_records())


def test_resumed_run_writes_byte_identical_files(tmp_path: Path) -> None:
    run_uninterrupted(tmp_path / "once")
    records = make_records()
    writer = DatasetWriter.open(tmp_path / "resumed", INFO)
    writer.append(records[:3], rejections(records[:3]))
    writer.append(records[3:6], rejections(records[3:6]))
    del writer  # crash: no finalize, no close ...
    with open(tmp_path / "resumed" / JOURNAL, "ab") as journal:
        journal.write(b'{"accepted": {"id": "half a li')  # ... in the middle of writing a batch

    with DatasetWriter.open(tmp_path / "resumed", INFO) as writer:
        assert writer.decided == {r.id for r in records[:6]} | {r.id for r in rejections(records[:6])}
        todo = [record for record in reversed(records) if record.id not in writer.decided]
        writer.append(todo[:4], rejections(records[6:]))
        writer.append(todo[4:] + records[:2])  # re-fed decided ids are ignored
        resumed_stats = writer.finalize(FAMILIES)
    once_stats = stats(tmp_path / "once")
    for name in (PARQUET, JSONL):
        assert (tmp_path / "resumed" / name).read_bytes() == (tmp_path / "once" / name).read_bytes()
    assert resumed_stats["run"].pop("created") and once_stats["run"].pop("created")
    assert resumed_stats == once_stats


def test_card_and_stats_report_counts_funnel_and_settings(tmp_path: Path) -> None:
    numbers = run_uninterrupted(tmp_path)
    assert numbers == stats(tmp_path) == stats(tmp_path, FAMILIES)
    assert numbers["tasks"] == 12 and numbers["decided"] == 24
    assert numbers["ops_per_task"] == {1: 8, 3: 4}
    assert numbers["tasks_per_family"] == {"activation": 4, "elementwise": 4, "reduction": 4, "linear": 2,
                                           "unknown": 2}  # torch.softmax is not in FAMILIES
    assert numbers["rejected"] == {"filter": {"eager_time_out_of_window": 3, "not_deterministic": 6},
                                   "decontaminate": {"benchmark_match": 3}}
    assert numbers["eager_ms"] == {"min": 0.5, "median": 6.0, "max": 11.5}
    assert numbers["run"]["eager_window_ms"] == [0.1, 100.0] and numbers["run"]["device"] == "cpu"
    card = (tmp_path / CARD).read_text()
    for text in ("| 3 | 4 |", "| reduction | 4 |", "| filter: not_deterministic | 6 |", "0.1 - 100 ms",
                 "seed_ops_version | 1", f"torch | {INFO.torch_version}", numbers["run"]["created"]):
        assert text in card


def test_stats_of_an_unfinished_run_come_from_the_journal(tmp_path: Path) -> None:
    records = make_records()
    with DatasetWriter.open(tmp_path, INFO) as writer:
        writer.append(records[:5], rejections(records[:2]))
    numbers = stats(tmp_path)
    assert numbers["tasks"] == 5 and numbers["decided"] == 7 and numbers["files"] == []
    with pytest.raises(DatasetError, match="finalize"):
        read_dataset(tmp_path)


def test_without_pyarrow_only_jsonl_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_uninterrupted(tmp_path / "with")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    numbers = run_uninterrupted(tmp_path / "without")
    assert numbers["files"] == [JSONL] and not (tmp_path / "without" / PARQUET).exists()
    assert "pyarrow is not installed" in (tmp_path / "without" / CARD).read_text()
    assert read_dataset(tmp_path / "without") == read_dataset(tmp_path / "with" / JSONL)
    with pytest.raises(DatasetError, match=r"tasks\.parquet: reading Parquet needs pyarrow"):
        read_dataset(tmp_path / "with" / PARQUET)


def test_reopening_with_other_settings_fails(tmp_path: Path) -> None:
    DatasetWriter.open(tmp_path, INFO).close()
    with pytest.raises(DatasetError, match="device: 'cpu' -> 'cuda'"):
        DatasetWriter.open(tmp_path, DatasetInfo(device="cuda", eager_window_ms=(0.1, 100.0)))


def test_records_of_another_seed_catalogue_are_refused(tmp_path: Path) -> None:
    stale = TaskRecord(code="x = 1\n", ops=[], composer="deterministic", seed=0, seed_ops_version="0")
    with DatasetWriter.open(tmp_path, INFO) as writer, pytest.raises(ValueError, match="seed_ops_version"):
        writer.append([stale])


def test_corrupt_journal_line_is_reported_with_its_number(tmp_path: Path) -> None:
    records = make_records()
    with DatasetWriter.open(tmp_path, INFO) as writer:
        writer.append(records[:2])
    lines = (tmp_path / JOURNAL).read_text().splitlines()
    (tmp_path / JOURNAL).write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(DatasetError, match=rf"{JOURNAL}:2: invalid JSON"):
        DatasetWriter.open(tmp_path, INFO)
    (tmp_path / JOURNAL).write_text("\n".join([lines[0], '{"retimed": {"id": "x", "eager_ms": "fast"}}']) + "\n")
    with pytest.raises(DatasetError, match=rf"{JOURNAL}:2: invalid retimed entry \(expected id, eager_ms and compile_ms"):
        DatasetWriter.open(tmp_path, INFO)


def test_a_retimed_task_names_the_device_that_timed_it_and_older_entries_keep_theirs(tmp_path: Path) -> None:
    first, second, third = make_records()[:3]
    with DatasetWriter.open(tmp_path, INFO) as writer:
        writer.append([first, second, third])
        assert writer.retime({first.id: (2.5, 1.5, "NVIDIA H100 80GB HBM3"), second.id: (3.0, 2.0, None)}) == 2
        assert writer.retime({first.id: (2.5, 1.5, "NVIDIA H100 80GB HBM3")}) == 0  # the same timing: nothing new
        assert writer.retime({first.id: (2.5, 1.5, "NVIDIA H200")}) == 1  # the same times from another GPU
    with (tmp_path / JOURNAL).open("a") as journal:  # an entry journaled before entries named their device
        journal.write(json.dumps({"retimed": {"id": third.id, "eager_ms": 4.0, "compile_ms": 1.0}}) + "\n")
    with DatasetWriter.reopen(tmp_path) as writer:  # the journal replayed
        by_id = {record.id: record for record in writer.accepted}
    assert (by_id[first.id].eager_ms, by_id[first.id].device) == (2.5, "NVIDIA H200")
    assert (by_id[second.id].eager_ms, by_id[second.id].device) == (3.0, second.device)
    assert (by_id[third.id].eager_ms, by_id[third.id].device) == (4.0, third.device)
    (tmp_path / JOURNAL).write_text((tmp_path / JOURNAL).read_text().replace('"compile_ms": 1.0}', '"compile_ms": 1.0, "device": 7}'))
    with pytest.raises(DatasetError, match=r"invalid retimed entry .*device as a string"):
        DatasetWriter.reopen(tmp_path)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(("change", "message"), [
    (lambda row: row.pop("seed"), r"bad\.jsonl:2: missing column\(s\) seed"),
    (lambda row: row.update(ops="torch.relu"), r"bad\.jsonl:2: column 'ops' must be a list of strings"),
    (lambda row: row.update(eager_ms="fast"), r"bad\.jsonl:2: column 'eager_ms' must be a number"),
    (lambda row: row.update(code=row["code"] + "\n"), r"bad\.jsonl:2: column 'id' .* code was changed"),
])
def test_invalid_jsonl_rows_name_file_line_and_column(tmp_path: Path, change, message: str) -> None:
    rows = [record.to_row() for record in make_records()[:2]]
    change(rows[1])
    with pytest.raises(DatasetError, match=message):
        read_dataset(write_jsonl(tmp_path / "bad.jsonl", rows))


def test_invalid_parquet_names_file_and_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [record.to_row() for record in make_records()[:2]]
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in row.items() if k != "composer"} for row in rows]),
                   tmp_path / "a.parquet")
    with pytest.raises(DatasetError, match=r"a\.parquet: missing column\(s\) composer"):
        read_dataset(tmp_path / "a.parquet")
    for row in rows:
        row["seed"] = "seven"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "b.parquet")
    with pytest.raises(DatasetError, match=r"b\.parquet row 0: column 'seed' must be an integer"):
        read_dataset(tmp_path / "b.parquet")


def test_missing_paths_are_reported(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        read_dataset(tmp_path / "nothing.parquet")
    with pytest.raises(DatasetError, match=f"no {PARQUET} or {JSONL}"):
        read_dataset(tmp_path)
    with pytest.raises(DatasetError, match=r"expected a \.parquet or \.jsonl"):
        read_dataset(write_jsonl(tmp_path / "rows.csv", []))


def test_columns_cover_every_task_record_field() -> None:
    assert set(dataset._COLUMNS) == set(make_records()[0].to_row())


def test_a_sample_takes_equal_shares_per_fused_op_count_in_id_order(tmp_path: Path) -> None:
    run_uninterrupted(tmp_path / "full")
    numbers = dataset.write_sample(tmp_path / "full", 5, tmp_path / "sample")
    records = make_records()
    by_count: dict[int, list[TaskRecord]] = {}
    for record in sorted(records, key=lambda r: r.id):
        by_count.setdefault(len(record.ops), []).append(record)
    # 1-op and 3-op tasks: shares of 3 and 2 (one each per round, 1-ops first).
    expected = sorted(by_count[1][:3] + by_count[3][:2], key=lambda r: r.id)
    assert read_dataset(tmp_path / "sample" / PARQUET) == expected
    assert numbers["ops_per_task"] == {1: 3, 3: 2} and numbers["sample_of"]["tasks"] == len(records)
    card = (tmp_path / "sample" / CARD).read_text()
    assert "A sample of 5 of the 12 tasks of `../full`" in card and "0.1 - 100 ms" in card  # portable: no absolute path
    with pytest.raises(DatasetError, match="between 1 and the 12 tasks"):
        dataset.write_sample(tmp_path / "full", 13, tmp_path / "too-many")


def test_bundled_sample_is_a_stratified_gpu_dataset() -> None:
    sample = Path(__file__).resolve().parents[2] / "examples" / "data" / "synth-h100-sample"
    records = read_dataset(sample / PARQUET)
    assert len(records) == 200 and {len(r.ops) for r in records} == {1, 2, 3, 4, 5}
    assert all(r.device == "cuda" and 1.0 <= r.eager_ms <= 100.0 and r.compile_ms for r in records)
    assert all(result.task is not None for result in load_tasks(sample / PARQUET))


def test_a_directory_whose_meta_predates_new_settings_resumes_and_records_them(tmp_path: Path) -> None:
    run_uninterrupted(tmp_path)
    meta = json.loads((tmp_path / dataset.META).read_text())
    for key in ("max_input_mb", "max_op_sequence_share"):
        del meta["info"][key]
    (tmp_path / dataset.META).write_text(json.dumps(meta))
    with DatasetWriter.open(tmp_path, INFO) as writer:
        assert len(writer.accepted) == 12
    assert json.loads((tmp_path / dataset.META).read_text())["info"]["max_op_sequence_share"] == 1.0


def test_a_published_copy_without_its_journal_is_not_rewritten(tmp_path: Path) -> None:
    run_uninterrupted(tmp_path)
    (tmp_path / JOURNAL).unlink()
    with pytest.raises(DatasetError, match="no journal.jsonl"):
        DatasetWriter.reopen(tmp_path)
    assert len(read_dataset(tmp_path)) == 12

"""A set's self-check gathered over several runs (synth/checks.py): a later check of a task replaces
its earlier one, checks that say nothing about a task leave it to check again, and a bad file is
named."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.synth import checks
from cuda_agent.synth.card import _checks_section
from cuda_agent.synth.full_card import read_checks


def _row(task: str, status: str, at: float, eager_ms: float | None = 2.0) -> dict:
    return {"task": task, "status": status, "error": None if status == "correct" else "why", "eager_ms": eager_ms,
            "compile_ms": 1.0, "eager_tf32_on_ms": 1.5, "compile_tf32_on_ms": 0.9, "input_gb": 0.3,
            "output_gb": 0.1, "verdict_s": 7.5, "device": "NVIDIA H200", "checked_at": at}


def test_checking_on_one_gpu_model_takes_the_tasks_checked_on_others_after_the_unchecked(tmp_path: Path) -> None:
    """A set whose check must have run on an H100, partly checked on H200s: the unchecked first,
    then those the H200s judged; the H100's own rows and the tasks left to retry are not repeated."""
    path = tmp_path / checks.CHECKS
    h100 = {**_row("a", "correct", 10), "device": "NVIDIA H100 80GB HBM3"}
    checks.merge(path, [h100, _row("b", "correct", 10), _row("c", "correct", 10), _row("d", "infra_error", 10)])
    stored = checks.read(path)
    order = checks.to_check(list("abcdef"), stored, seed=3, on="H100")
    assert sorted(order[:3]) == ["d", "e", "f"] and sorted(order[3:]) == ["b", "c"]
    assert order[:3] == checks.to_check(list("abcdef"), stored, seed=3)
    assert checks.to_check(list("abcdef"), stored, seed=3, on="H200") == [*order[:3], "a"]


def test_later_checks_replace_earlier_ones_and_only_telling_ones_count_as_checked(tmp_path: Path) -> None:
    path = tmp_path / checks.CHECKS
    first = checks.merge(path, [_row("a", "correct", 10), _row("b", "infra_error", 10), _row("c", "task_error", 10)])
    assert first == {"added": 3, "replaced": 0, "rows": 3}
    again = checks.merge(path, [_row("a", "correct", 5, eager_ms=9.0),  # older than the stored one: ignored
                                _row("b", "correct", 20), _row("d", "harness_error", 20)])
    assert again == {"added": 1, "replaced": 1, "rows": 4}
    stored = checks.read(path)
    assert stored["a"]["eager_ms"] == 2.0 and stored["b"]["status"] == "correct"
    assert sorted(checks.to_check(["a", "b", "c", "d", "e"], stored)) == ["d", "e"]
    assert checks.to_check(list("abcdefgh"), {}, seed=1) == checks.to_check(list("abcdefgh"), {}, seed=1)
    assert checks.to_check(list("abcdefgh"), {}, seed=1) != checks.to_check(list("abcdefgh"), {}, seed=2)
    card = read_checks(path, {"a": (2.0, 1.0), "b": (2.0, 7.0), "c": (2.0, 1.0), "x": (2.0, 1.0)}, (1.0, 1.5))
    assert card == {"path": "checks.parquet", "checked": 3, "correct": 2,
                    "statuses": {"correct": 2, "task_error": 1}, "not_checked": 1, "timed_by_check": 1,
                    "failed": [{"task": "c", "status": "task_error", "error": "why"}], "withdrawn": [],
                    "outside_window": [{"task": "a", "eager_ms": 2.0}, {"task": "b", "eager_ms": 2.0}]}
    section = _checks_section(card)
    assert "2 `correct` of 3 tasks checked; 1 task of the set without a result" in section
    assert "| `c` | task_error | why |" in section and "| `a` | 2 |" in section


def test_a_file_that_is_not_a_checks_file_is_named_with_what_it_lacks(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "checks.parquet"
    pq.write_table(pa.table({"task": ["a"], "status": ["correct"]}), path)
    with pytest.raises(ValueError, match=r"checks.parquet: not a checks file \(missing columns error, eager_ms"):
        checks.read(path)
    assert checks.read(tmp_path / "absent.parquet") == {}


def test_a_checks_file_from_before_the_memory_columns_reads_them_as_unknown(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / checks.CHECKS
    older = [column for column in checks.COLUMNS if column not in checks.LATER_COLUMNS]
    pq.write_table(pa.Table.from_pylist([{column: _row("a", "correct", 1)[column] for column in older}]), path)
    assert checks.read(path)["a"]["reference_device_gb"] is None
    checks.merge(path, [{**_row("b", "correct", 2), "reference_device_gb": 2.5}])
    stored = checks.read(path)
    assert stored["a"]["eager_ms"] == 2.0 and stored["b"]["reference_device_gb"] == 2.5

"""Loading KernelBench-format tasks: single files, directories and dataset tables (static, no import)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cuda_agent.environment import Task, TaskLoadError, load_task, load_tasks
from cuda_agent.environment.task import check_source

ELEMENTWISE_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.{op}(x)


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
'''

MISSING_MODEL = '''
import torch

def get_inputs():
    return [torch.randn(4)]

def get_init_inputs():
    return []
'''

MISSING_GET_INPUTS = '''
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x

def get_init_inputs():
    return []
'''

MISSING_GET_INIT_INPUTS = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x

def get_inputs():
    return [torch.randn(4)]
'''

SYNTAX_ERROR = '''
import torch.nn as nn

class Model(nn.Module)
    def forward(self, x):
        return x
'''


def task_code(op: str = "relu") -> str:
    return ELEMENTWISE_TASK.format(op=op)


def test_load_task_returns_id_code_and_origin(tmp_path: Path) -> None:
    path = tmp_path / "19_ReLU.py"
    path.write_text(task_code())
    task = load_task(path)
    assert task == Task(id="19_ReLU", code=task_code(), origin=str(path))
    assert len(task.code_hash) == 64


def test_task_code_hash_changes_with_code() -> None:
    assert Task("a", task_code("relu"), "x").code_hash != Task("a", task_code("tanh"), "x").code_hash
    assert Task("a", task_code(), "x").code_hash == Task("b", task_code(), "y").code_hash


@pytest.mark.parametrize(
    ("code", "missing"),
    [
        (MISSING_MODEL, "Model"),
        (MISSING_GET_INPUTS, "get_inputs"),
        (MISSING_GET_INIT_INPUTS, "get_init_inputs"),
    ],
)
def test_load_task_names_the_missing_kernelbench_name(tmp_path: Path, code: str, missing: str) -> None:
    path = tmp_path / "task.py"
    path.write_text(code)
    with pytest.raises(TaskLoadError, match=rf"{re.escape(str(path))}: missing top-level {missing}\b"):
        load_task(path)


def test_load_task_reports_syntax_error_with_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text(SYNTAX_ERROR)
    with pytest.raises(TaskLoadError, match=rf"{re.escape(str(path))}: syntax error at line 4"):
        load_task(path)


def test_load_task_on_nonexistent_file_says_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="cannot read problem file"):
        load_task(tmp_path / "nope.py")


def test_check_source_accepts_names_bound_by_assignment_and_import() -> None:
    code = (
        "from torch.nn import Identity as Model\n"
        "import torch\n"
        "get_inputs = lambda: [torch.randn(3)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    check_source(code, "<inline>")


def test_check_source_ignores_names_defined_only_inside_functions() -> None:
    code = "def make():\n    class Model: pass\n\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"
    with pytest.raises(TaskLoadError, match="missing top-level Model"):
        check_source(code, "<inline>")


def test_load_tasks_orders_directory_naturally(tmp_path: Path) -> None:
    for name in ("10_z.py", "2_y.py", "1_x.py", "21_w.py"):
        (tmp_path / name).write_text(task_code())
    results = load_tasks(tmp_path)
    assert [Path(r.origin).name for r in results] == ["1_x.py", "2_y.py", "10_z.py", "21_w.py"]
    assert [r.task.id for r in results] == ["1_x", "2_y", "10_z", "21_w"]
    assert all(r.error is None for r in results)


def test_load_tasks_skips_private_files_and_non_python(tmp_path: Path) -> None:
    (tmp_path / "1_ok.py").write_text(task_code())
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_helpers.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not a task")
    assert [Path(r.origin).name for r in load_tasks(tmp_path)] == ["1_ok.py"]


def test_load_tasks_reports_each_broken_entry_without_stopping(tmp_path: Path) -> None:
    files = {
        "1_ok.py": task_code(),
        "2_no_model.py": MISSING_MODEL,
        "3_no_get_inputs.py": MISSING_GET_INPUTS,
        "4_no_get_init_inputs.py": MISSING_GET_INIT_INPUTS,
        "5_syntax.py": SYNTAX_ERROR,
        "6_ok.py": task_code("tanh"),
    }
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    results = {Path(r.origin).name: r for r in load_tasks(tmp_path)}
    assert list(results) == list(files)
    assert results["1_ok.py"].task is not None and results["1_ok.py"].error is None
    assert results["6_ok.py"].task is not None and results["6_ok.py"].error is None
    expected_errors = {
        "2_no_model.py": "missing top-level Model",
        "3_no_get_inputs.py": "missing top-level get_inputs",
        "4_no_get_init_inputs.py": "missing top-level get_init_inputs",
        "5_syntax.py": "syntax error at line 4",
    }
    for name, fragment in expected_errors.items():
        assert results[name].task is None
        assert fragment in results[name].error
        assert name in results[name].error


def test_load_tasks_accepts_a_single_problem_file(tmp_path: Path) -> None:
    path = tmp_path / "7_x.py"
    path.write_text(task_code())
    [result] = load_tasks(path)
    assert result.task is not None and result.task.id == "7_x"


def test_load_tasks_on_nonexistent_path_raises(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="no such file or directory"):
        load_tasks(tmp_path / "missing")


def test_load_tasks_rejects_unsupported_suffix_listing_the_allowed_ones(tmp_path: Path) -> None:
    path = tmp_path / "tasks.csv"
    path.write_text("code\n")
    with pytest.raises(TaskLoadError, match=r"\.parquet, \.jsonl"):
        load_tasks(path)


# -- datasets ----------------------------------------------------------------------------------

def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_load_tasks_reads_jsonl_rows_with_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [
        {"id": "relu", "code": task_code("relu")},
        {"data_source": "kb/tanh", "code": task_code("tanh")},
        {"code": task_code("sigmoid")},
    ])
    results = load_tasks(path)
    assert [r.task.id for r in results] == ["relu", "row1", "row2"]
    assert [r.origin for r in results] == [f"{path}#0", f"{path}#1", f"{path}#2"]
    assert "torch.tanh" in results[1].task.code


def test_load_tasks_gives_ops6k_rows_unique_stable_ids_by_row_index(tmp_path: Path) -> None:
    """CUDA-Agent-Ops-6K has ``ops``, ``data_source`` and ``code`` and no id; many rows share a
    ``data_source`` (``torch#2``), so ids come from the row index and do not change between loads."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "ops6k.parquet"
    pq.write_table(pa.table({"ops": [["relu"], ["tanh"], ["relu", "tanh"]],
                             "data_source": ["torch#1", "torch#1", "torch#2"],
                             "code": [task_code(), task_code("tanh"), task_code("sigmoid")]}), path)
    first, second = load_tasks(path), load_tasks(path)
    assert [r.task.id for r in first] == ["row0", "row1", "row2"]
    assert [r.task.id for r in second] == [r.task.id for r in first]


def test_load_tasks_reports_repeated_and_invalid_ids_per_row(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [
        {"id": "a", "code": task_code()},
        {"id": "a", "code": task_code("tanh")},
        {"id": ["x"], "code": task_code("sigmoid")},
        {"id": "row4", "code": task_code()},
        {"code": task_code("tanh")},
        {"id": "b", "prompt": "no code here"},
    ])
    results = load_tasks(path)
    assert results[0].task.id == "a"
    assert f"{path}#1: id 'a' repeats row 0" in results[1].error
    assert "'id' must be a string or an integer" in results[2].error
    assert results[3].task.id == "row4"
    assert "id 'row4' repeats row 3" in results[4].error
    assert "no 'code'" in results[5].error and "'prompt'" in results[5].error


def test_load_tasks_keeps_integer_ids_including_zero(tmp_path: Path) -> None:
    """Datasets commonly number their rows from 0; id 0 is an id like any other."""
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"id": 0, "code": task_code()}, {"id": 1, "code": task_code("tanh")}])
    assert [r.task.id for r in load_tasks(path)] == ["0", "1"]


def test_load_tasks_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"code": task_code()}) + "\n\n   \n" + json.dumps({"code": task_code("tanh")}) + "\n")
    assert len(load_tasks(path)) == 2


def test_load_tasks_jsonl_reports_bad_rows_per_entry(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [
        {"code": task_code()},
        {"code": MISSING_MODEL},
        {"code": 42},
        {"code": SYNTAX_ERROR},
    ])
    results = load_tasks(path)
    assert results[0].task is not None
    assert "missing top-level Model" in results[1].error and f"{path}#1" in results[1].error
    assert "'code' must be a string, got int" in results[2].error
    assert "syntax error" in results[3].error


def test_load_tasks_jsonl_without_code_column_names_the_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"id": "a", "source": task_code()}])
    with pytest.raises(TaskLoadError, match=r"no 'code' column \(columns: \['id', 'source'\]\)"):
        load_tasks(path)


def test_load_tasks_jsonl_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"code": task_code()}) + "\n{not json\n")
    with pytest.raises(TaskLoadError, match=rf"{re.escape(str(path))}:2: invalid JSON"):
        load_tasks(path)


def test_load_tasks_jsonl_non_object_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('["code"]\n')
    with pytest.raises(TaskLoadError, match=rf"{re.escape(str(path))}:1: each line must be a JSON object"):
        load_tasks(path)


def test_load_tasks_reads_parquet_code_column(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "tasks.parquet"
    table = pa.table({"id": ["relu", "bad", "tanh"], "code": [task_code(), MISSING_GET_INPUTS, task_code("tanh")]})
    pq.write_table(table, path)
    results = load_tasks(path)
    assert [r.origin for r in results] == [f"{path}#0", f"{path}#1", f"{path}#2"]
    assert results[0].task.id == "relu" and results[2].task.id == "tanh"
    assert results[1].task is None and "missing top-level get_inputs" in results[1].error


def test_load_tasks_parquet_without_code_column_is_an_error(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"prompt": ["x"]}), path)
    with pytest.raises(TaskLoadError, match="no 'code' column"):
        load_tasks(path)


def test_load_tasks_corrupt_parquet_is_a_task_load_error(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    path = tmp_path / "tasks.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(TaskLoadError, match="cannot read Parquet file"):
        load_tasks(path)

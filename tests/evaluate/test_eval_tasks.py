"""Task sets (KernelBench checkouts, level folders, plain folders, datasets) and how solutions are
matched to their tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuda_agent.evaluate import TaskSetError, load_task_set, match_solutions

from support import SMALL_RELU_TASK

CODE = SMALL_RELU_TASK.read_text()


@pytest.fixture()
def kernelbench(tmp_path: Path) -> Path:
    """A KernelBench-shaped checkout: ``<root>/KernelBench/level{1,2,4}/<N>_<name>.py``."""
    root = tmp_path / "checkout"
    for level, names in {1: ["1_Square_matmul.py", "19_ReLU.py", "2_Other.py"], 2: ["1_Conv_ReLU.py"],
                         4: ["1_hf_model.py"]}.items():
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_text(CODE)
    return root


def test_kernelbench_checkout_keys_tasks_by_level_and_problem_number(kernelbench: Path) -> None:
    """Without --level a checkout gives levels 1-3 (the paper's protocol); level 4 only when named."""
    tasks = load_task_set(kernelbench)
    assert [(t.key, t.level, t.number) for t in tasks] == [
        ("level1_problem1", 1, 1), ("level1_problem2", 1, 2), ("level1_problem19", 1, 19), ("level2_problem1", 2, 1)]
    assert [t.key for t in load_task_set(kernelbench, (2,))] == ["level2_problem1"]
    assert [t.key for t in load_task_set(kernelbench / "KernelBench")] == [t.key for t in tasks]
    assert [t.key for t in load_task_set(kernelbench / "KernelBench" / "level2")] == ["level2_problem1"]
    assert [t.key for t in load_task_set(kernelbench, (1, 4))][-1] == "level4_problem1"
    assert [t.key for t in load_task_set(kernelbench / "KernelBench" / "level4")] == ["level4_problem1"]


def test_level_errors_name_what_is_available(kernelbench: Path, tmp_path: Path) -> None:
    with pytest.raises(TaskSetError, match="no level 3; available: 1, 2, 4"):
        load_task_set(kernelbench, (3,))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "relu.py").write_text(CODE)
    with pytest.raises(TaskSetError, match="--level needs a KernelBench checkout"):
        load_task_set(tmp_path / "plain", (1,))
    with pytest.raises(TaskSetError, match="no such file or directory"):
        load_task_set(tmp_path / "absent")


def test_dataset_tasks_are_unleveled_and_a_repeated_id_is_a_task_that_does_not_load(tmp_path: Path) -> None:
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("\n".join(json.dumps({"id": name, "code": CODE}) for name in ("a", "b")) + "\n")
    assert [(t.key, t.level) for t in load_task_set(dataset)] == [("a", None), ("b", None)]
    dataset.write_text("\n".join(json.dumps({"id": "a", "code": CODE}) for _ in range(2)) + "\n")
    first, second = load_task_set(dataset)
    assert first.key == "a" and second.key == "tasks.jsonl#1"
    assert second.task is None and "id 'a' repeats row 0" in second.error


def test_unloadable_task_stays_in_the_set_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "good.py").write_text(CODE)
    (tmp_path / "set" / "broken.py").write_text("class Model:\n")
    tasks = {t.key: t for t in load_task_set(tmp_path / "set")}
    assert tasks["broken"].task is None and "syntax error" in tasks["broken"].error
    assert tasks["good"].task is not None


def solutions_folder(root: Path, names: list[str]) -> Path:
    """A solutions folder with an empty file for each ``*.py`` name and a folder for the others."""
    folder = root / "solutions"
    folder.mkdir()
    for name in names:
        (folder / name).write_text("") if name.endswith(".py") else (folder / name).mkdir()
    return folder


def test_solutions_match_by_problem_number_or_task_id_file_or_folder(kernelbench: Path, tmp_path: Path) -> None:
    tasks = load_task_set(kernelbench)
    solutions = solutions_folder(tmp_path, ["level1_problem1.py", "19_ReLU.py", "level2_problem1", "notes.py"])
    match = match_solutions(tasks, solutions)
    assert match.by_task == {"level1_problem1": solutions / "level1_problem1.py", "level1_problem2": None,
                             "level1_problem19": solutions / "19_ReLU.py",
                             "level2_problem1": solutions / "level2_problem1"}
    assert match.unmatched == [solutions / "notes.py"] and match.n_found == 3


def test_solution_matching_rejects_ambiguity_and_folders_that_match_nothing(kernelbench: Path, tmp_path: Path) -> None:
    tasks = load_task_set(kernelbench)
    solutions = solutions_folder(tmp_path, ["level1_problem1.py", "1_Square_matmul.py"])
    with pytest.raises(TaskSetError, match="both answer task level1_problem1"):
        match_solutions(tasks, solutions)
    for path in solutions.iterdir():
        path.unlink()
    (solutions / "unrelated.py").write_text("")
    with pytest.raises(TaskSetError, match="e.g. level1_problem1.py"):
        match_solutions(tasks, solutions)

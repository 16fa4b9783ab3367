"""Jobs that travel between processes: solution files, their staging, and verdict round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuda_agent.environment import EvalConfig, Verdict, load_solution, load_task
from cuda_agent.environment.build import build_key
from cuda_agent.environment.verdict import Status
from cuda_agent.pool import EvalJob, JobInputError, SolutionFiles

from support import EXAMPLES, SMALL_RELU_TASK


@pytest.mark.parametrize("name", ["../model_new.py", "/etc/passwd", "kernels/../../x.cu", "", "a\\b.py", "./x.py"])
def test_solution_files_reject_paths_that_leave_the_solution(name: str) -> None:
    with pytest.raises(JobInputError, match="relative path"):
        SolutionFiles.from_mapping({name: "class ModelNew: pass"})


def test_solution_files_need_at_least_one_file() -> None:
    with pytest.raises(JobInputError, match="at least one file"):
        SolutionFiles.from_mapping({})


@pytest.mark.parametrize("solution", [EXAMPLES / "solutions" / "cpu" / "relu.py",
                                      EXAMPLES / "solutions" / "cpu_workdir" / "relu"])
def test_staged_solution_has_the_build_key_of_the_original(solution: Path, tmp_path: Path) -> None:
    """Staging keeps file names, so a staged copy is a build-cache hit for the original's build."""
    files = SolutionFiles.from_path(solution)
    staged = files.stage(tmp_path)
    assert staged.is_file() == solution.is_file()
    config = EvalConfig(device="cpu").build
    assert build_key(load_solution(staged), "cpu", config) == build_key(load_solution(solution), "cpu", config)
    assert files.stage(tmp_path) == staged  # content-addressed: staging again reuses the folder


def test_workdir_files_keep_kernels_and_skip_build_outputs(tmp_path: Path) -> None:
    root = tmp_path / "relu"
    (root / "kernels").mkdir(parents=True)
    (root / "model_new.py").write_text("import cuda_extension\nclass ModelNew: pass\n")
    (root / "kernels" / "relu.cpp").write_text("// kernel")
    (root / "kernels" / "relu_binding.cpp").write_text("// binding")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "model_new.cpython-311.pyc").write_bytes(b"\0")
    (root / "cuda_extension.so").write_bytes(b"\x7fELF")
    files = SolutionFiles.from_path(root)
    assert [name for name, _ in files.files] == ["kernels/relu.cpp", "kernels/relu_binding.cpp", "model_new.py"]
    assert not files.is_single_file


def test_solution_files_reject_lone_surrogates() -> None:
    with pytest.raises(JobInputError, match="lone surrogate"):
        SolutionFiles.from_mapping({"model_new.py": "x = '\ud800'"})


def test_a_failed_staging_leaves_no_partial_folder(tmp_path: Path) -> None:
    files = SolutionFiles.from_mapping({"a.py": "x = 1", "a.py/b.py": "y = 2"})  # a.py cannot be file and folder
    with pytest.raises(OSError):
        files.stage(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_verdict_json_mends_unencodable_text() -> None:
    verdict = Verdict(compiled=True, correct=False, reward=-1, eager_ms=None, compile_ms=None, candidate_ms=None,
                      speedup_vs_eager=None, speedup_vs_compile=None, violations=[], error="bad \ud800 text",
                      precision_policy="faithful", status=Status.RUNTIME_ERROR, device="cpu", task="t")
    data = verdict.to_json_dict()
    assert data["error"] == "bad \ufffd text"
    assert json.dumps(data, ensure_ascii=False).encode()  # UTF-8 can hold it


def test_job_round_trips_through_json() -> None:
    job = EvalJob("j1", load_task(SMALL_RELU_TASK), SolutionFiles.from_path(EXAMPLES / "solutions" / "cpu" / "relu.py"))
    assert EvalJob.from_json_dict(json.loads(json.dumps(job.to_json_dict()))) == job


def test_verdict_round_trips_through_its_json_form() -> None:
    data = {
        "compiled": True, "correct": True, "reward": 2, "eager_ms": 2.0, "compile_ms": None, "candidate_ms": 1.0,
        "speedup_vs_eager": 2.0, "speedup_vs_compile": None, "speedup_vs_eager_lower": 1.9,
        "speedup_vs_compile_lower": None, "reward_confidence": 0.95, "reward_drift": 0.02,
        "violations": [{"code": "x", "message": "y"}],
        "error": None, "precision_policy": "faithful", "status": "correct", "device": "cpu", "task": "relu",
        "preset": "paper", "speedups": {"eager_tf32_off": 2.0},
        "baselines": {"eager_tf32_off": {"median_ms": 2.0, "mean_ms": 2.1, "std_ms": 0.1, "n": 10,
                                         "rel_std_err": 0.01, "budget_exhausted": False, "calls_per_sample": 1,
                                         "median_rel_err": 0.004}},
        "baseline_sources": {"eager_tf32_off": "timed"}, "baseline_seconds": {"eager_tf32_off": 0.4},
        "candidate_timing": None, "reward_baseline": "tf32_off",
        "trials": [{"index": 0, "kind": "standard", "passed": True, "message": "ok", "max_abs_err": 0.0,
                    "error_ratio": None}],
        "build": {"cached": True, "seconds": 0.1, "key": "k", "log_tail": "", "compile_stats": {}}, "notes": [],
        "phase_seconds": {"total": 1.0}, "device_seconds": {"wait": 0.5, "measure": 0.2, "use": 0.1},
        "device_turns": [{"phase": "profile", "mode": "measure", "asked_at": 1.0, "wait_s": 0.5, "held_s": 0.2}],
        "environment": {"torch": "2.13", "device_shared": "2 evaluations at once"},
        "problem_bytes": {"input_bytes": 16, "output_bytes": None},
        "memory_mb": {"reference": {"loaded_host_mb": 300.0, "peak_host_mb": 310.5}},
    }
    verdict = Verdict.from_json_dict(data)
    assert verdict.status is Status.CORRECT and verdict.baselines["eager_tf32_off"].n == 10
    assert verdict.to_json_dict() == data

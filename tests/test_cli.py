"""The ``cuda-agent`` command line: the ``verify --json`` contract, exit statuses, ``tasks list``, ``demo``.

Commands run as subprocesses with ``CUDA_AGENT_CACHE_DIR`` on the session's shared cache, so they
reuse the builds (and baselines) of the in-process tests.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support import EXAMPLES, FIXTURES, SMALL_RELU_TASK

CONTRACT_KEYS = [
    "compiled", "correct", "reward", "eager_ms", "compile_ms", "candidate_ms", "speedup_vs_eager",
    "speedup_vs_compile", "violations", "error", "precision_policy",
]


def run_cli(cli: list[str], env: dict[str, str], *args: str | Path,
            timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*cli, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout_s)


def one_line(text: str) -> str:
    """rich wraps long messages; undo it for substring checks."""
    return " ".join(text.split())


@pytest.fixture()
def verify_json(cli, cli_env, fast_config_file):
    """``verify_json(problem, solution, *extra)``: run ``verify --device cpu --json`` with small budgets."""

    def run(problem: Path, solution: Path, *extra: str) -> subprocess.CompletedProcess:
        return run_cli(cli, cli_env, "verify", problem, solution, "--device", "cpu", "--json",
                       "--no-compile-baseline", "--config", fast_config_file, *extra)

    return run


# -- verify --json -----------------------------------------------------------------------------

@pytest.mark.slow
def test_verify_json_prints_one_object_with_the_contract_keys(verify_json, fault_solution) -> None:
    result = verify_json(SMALL_RELU_TASK, fault_solution("relu_ok"))
    assert result.returncode == 0, result.stderr
    data = strict_json(result.stdout)  # the whole of stdout is one JSON object
    assert isinstance(data, dict)
    assert list(data)[: len(CONTRACT_KEYS)] == CONTRACT_KEYS
    assert data["compiled"] is True and data["correct"] is True
    assert data["reward"] in (1, 2, 3)
    assert isinstance(data["eager_ms"], float) and isinstance(data["candidate_ms"], float)
    assert data["speedup_vs_eager"] == pytest.approx(data["eager_ms"] / data["candidate_ms"])
    assert data["compile_ms"] is None and data["speedup_vs_compile"] is None
    assert data["violations"] == [] and data["error"] is None
    assert data["precision_policy"] == "faithful"
    assert data["status"] == "correct" and data["device"] == "cpu" and data["task"] == "small_relu"


def strict_json(text: str):
    """Parse as RFC 8259 JSON: NaN and Infinity are not JSON and break other languages' parsers."""

    def reject(constant: str):
        raise ValueError(f"not valid JSON: {constant}")

    return json.loads(text, parse_constant=reject)


@pytest.mark.slow
def test_verify_json_is_strict_json_for_an_incorrect_kernel(verify_json, fault_solution) -> None:
    """The wrong kernel's error is finite but the eager error is 0 (ReLU is exact), so the error
    ratio is infinite; the contract output must still be parseable as standard JSON."""
    result = verify_json(SMALL_RELU_TASK, fault_solution("relu_slightly_wrong"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "incorrect"
    strict_json(result.stdout)


def test_verify_json_exits_0_on_a_failing_verdict(verify_json) -> None:
    result = verify_json(SMALL_RELU_TASK, FIXTURES / "solutions" / "raise_in_forward.py")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["correct"] is False and data["reward"] == -1 and data["compiled"] is True
    assert data["status"] == "runtime_error"
    assert "ValueError: deliberate failure in ModelNew.forward" in data["error"]
    assert data["candidate_ms"] is None and data["speedup_vs_eager"] is None


@pytest.mark.slow
def test_verify_json_lists_violations_with_code_and_message(verify_json, fault_solution) -> None:
    result = verify_json(SMALL_RELU_TASK, fault_solution("return_input"))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "guard_violation" and data["reward"] == -1
    assert data["violations"] == [{"code": "output-aliases-input",
                                   "message": "output 0 shares memory with an input; outputs must be fresh tensors"}]


def test_verify_honours_the_precision_option(verify_json) -> None:
    result = verify_json(SMALL_RELU_TASK, FIXTURES / "solutions" / "raise_in_forward.py", "--precision", "kernelbench")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["precision_policy"] == "kernelbench"


def test_verify_exits_2_for_a_nonexistent_problem_file(verify_json, tmp_path: Path) -> None:
    result = verify_json(tmp_path / "missing.py", FIXTURES / "solutions" / "raise_in_forward.py")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read problem file" in one_line(result.stderr)


def test_verify_exits_2_for_a_problem_without_model(verify_json, tmp_path: Path) -> None:
    problem = tmp_path / "no_model.py"
    problem.write_text("import torch\n\ndef get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n")
    result = verify_json(problem, FIXTURES / "solutions" / "raise_in_forward.py")
    assert result.returncode == 2
    assert "missing top-level Model" in one_line(result.stderr)


def test_verify_exits_2_for_an_unknown_precision_policy(verify_json) -> None:
    result = verify_json(SMALL_RELU_TASK, FIXTURES / "solutions" / "raise_in_forward.py", "--precision", "fp8")
    assert result.returncode == 2
    stderr = one_line(result.stderr)
    assert "verify.precision 'fp8' is unknown" in stderr
    assert "valid: cuda-agent, faithful, kernelbench, tf32" in stderr


def test_verify_exits_2_for_a_missing_solution(verify_json, tmp_path: Path) -> None:
    result = verify_json(SMALL_RELU_TASK, tmp_path / "nothing")
    assert result.returncode == 2
    assert "no such file or directory" in one_line(result.stderr)


def test_verify_json_of_a_solution_that_does_not_parse_is_a_failing_verdict(verify_json, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nclass ModelNew(\n")
    result = verify_json(SMALL_RELU_TASK, broken)
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert (verdict["status"], verdict["reward"]) == ("solution_error", -1) and "syntax error" in verdict["error"]


def test_verify_on_cuda_without_a_gpu_is_bad_usage(cli, cli_env) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_cli(cli, cli_env, "verify", SMALL_RELU_TASK, EXAMPLES / "solutions" / "cpu" / "relu.py", "--device",
                     "cuda", timeout_s=120)
    assert result.returncode == 2 and "no CUDA GPU is visible" in one_line(result.stderr)
    assert "Traceback" not in result.stderr + result.stdout


def test_verify_of_a_cuda_solution_on_the_cpu_says_so_before_building(verify_json) -> None:
    """It was a compile_error after 10 s: "CUDA_HOME environment variable is not set"."""
    result = verify_json(SMALL_RELU_TASK, EXAMPLES / "solutions" / "cuda" / "relu.py")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert (verdict["status"], verdict["reward"], verdict["build"]) == ("compile_error", -1, None)
    assert verdict["error"].startswith("relu.py is a CUDA solution (relu.py:77 cuda_sources) and the device is the CPU")
    assert verdict["phase_seconds"]["total"] < 1, "it waited for workers or a compiler"


def test_verify_table_on_the_cpu_names_the_device_as_cpu_and_no_tf32(cli, cli_env, fast_config_file) -> None:
    """A verdict that ended before any worker reported the hardware says ``cpu`` too (others say
    ``cpu (<model>)``); the CPU has no TF32 to name."""
    result = run_cli(cli, cli_env, "verify", SMALL_RELU_TASK, EXAMPLES / "solutions" / "cuda" / "relu.py", "--device",
                     "cpu", "--config", fast_config_file, timeout_s=120)
    assert result.returncode == 0, result.stderr
    flat = one_line(result.stdout)
    assert "│ device │ cpu │" in flat and "│ precision policy │ faithful │" in flat and "TF32" not in flat


@pytest.mark.parametrize("command", [["eval"], ["serve"], ["train", "all"], ["synth", "run"], ["agent", "run"]])
def test_help_is_not_cut_when_piped(cli, cli_env, command) -> None:
    env = {key: value for key, value in cli_env.items() if key != "COLUMNS"}
    result = run_cli(cli, env, *command, "--help", timeout_s=120)
    assert result.returncode == 0 and "…" not in result.stdout


@pytest.mark.parametrize(("command", "usage"), [([], "[OPTIONS] COMMAND [ARGS]..."),
                                              (["verify"], "verify [OPTIONS] PROBLEM SOLUTION"),
                                              (["tasks", "list"], "tasks list [OPTIONS] PATH"),
                                              (["eval"], "eval [OPTIONS]")])
def test_help_names_arguments_as_usual_and_gives_flags_no_type(cli, cli_env, command, usage) -> None:
    result = run_cli(cli, cli_env, *command, "--help", timeout_s=120)
    assert result.returncode == 0, result.stderr
    [usage_line] = [line for line in result.stdout.splitlines() if "Usage:" in line]
    assert usage_line.strip().endswith(usage), usage_line
    assert "--help" in result.stdout and "<bool>" not in result.stdout
    if command == ["eval"]:
        assert "(default: runs/eval-<solutions folder name>)" in one_line(result.stdout.replace("│", " "))


def test_version(cli, cli_env) -> None:
    from cuda_agent import __version__

    result = run_cli(cli, cli_env, "--version", timeout_s=120)
    assert result.returncode == 0 and result.stdout.strip() == f"cuda-agent {__version__}"


def test_report_refuses_a_file_that_is_not_a_results_store(cli, cli_env, tmp_path: Path) -> None:
    notes = tmp_path / "some.txt"
    notes.write_text("not a database\n")
    result = run_cli(cli, cli_env, "report", notes, timeout_s=120)
    assert result.returncode == 2 and "not a results store" in one_line(result.stderr)
    assert notes.read_text() == "not a database\n"


def test_verify_exits_2_for_too_few_trials(verify_json) -> None:
    result = verify_json(SMALL_RELU_TASK, FIXTURES / "solutions" / "raise_in_forward.py", "--trials", "2")
    assert result.returncode == 2
    assert "verify.trials must be >= 5" in one_line(result.stderr)


# -- tasks list --------------------------------------------------------------------------------

def test_tasks_list_shows_static_and_import_failures_in_natural_order(cli, cli_env, tmp_path: Path) -> None:
    good = SMALL_RELU_TASK.read_text()
    (tmp_path / "10_no_model.py").write_text("def get_inputs(): return []\ndef get_init_inputs(): return []\n")
    (tmp_path / "2_import_fails.py").write_text("import no_such_module_4711\n" + good)
    (tmp_path / "3_import_fails.py").write_text("import no_such_module_4711\n" + good)
    (tmp_path / "1_ok.py").write_text(good)
    result = run_cli(cli, cli_env, "tasks", "list", tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.index("1_ok") < out.index("2_import_fails") < out.index("10_no_model")
    flat = one_line(out)
    assert "import failed: ModuleNotFoundError: No module named 'no_such_module_4711'" in flat
    assert "missing top-level Model" in flat
    assert "1 of 4 loaded" in flat
    assert "2 failed with: import failed: ModuleNotFoundError: No module named 'no_such_module_4711'" in flat


def test_tasks_list_without_import_check_misses_import_failures(cli, cli_env, tmp_path: Path) -> None:
    (tmp_path / "1_import_fails.py").write_text("import no_such_module_4711\n" + SMALL_RELU_TASK.read_text())
    result = run_cli(cli, cli_env, "tasks", "list", tmp_path, "--no-import-check")
    assert result.returncode == 0, result.stderr
    assert "1 of 1 loaded" in one_line(result.stdout)


def test_tasks_list_failed_names_the_dataset_rows_that_fail_and_why(cli, cli_env, tmp_path: Path) -> None:
    good = SMALL_RELU_TASK.read_text()
    rows = [{"data_source": "torch#1", "code": good}, {"data_source": "torch#1", "code": "import nope_4711\n" + good},
            {"data_source": "torch#1", "code": "class Model: pass\n"}]
    path = tmp_path / "ops.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_cli(cli, cli_env, "tasks", "list", path, "--failed")
    assert result.returncode == 0, result.stderr
    flat = one_line(result.stdout)
    assert "row1" in flat and "No module named 'nope_4711'" in flat
    assert "ops.jsonl#2" in flat and "missing top-level get_inputs" in flat
    assert "row0" not in flat
    assert "1 of 3 loaded" in flat


def test_tasks_list_exits_2_for_a_nonexistent_path(cli, cli_env, tmp_path: Path) -> None:
    result = run_cli(cli, cli_env, "tasks", "list", tmp_path / "missing")
    assert result.returncode == 2
    assert "no such file or directory" in one_line(result.stderr)


def test_tasks_list_on_a_folder_without_problems_names_the_task_sets_below_it_and_exits_2(
        cli, cli_env, tmp_path: Path) -> None:
    """As ``tasks list examples/data`` did: the sample dataset is one folder deeper."""
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "1_relu.py").write_text(SMALL_RELU_TASK.read_text())
    (tmp_path / "sample").mkdir()
    (tmp_path / "sample" / "tasks.jsonl").write_text(json.dumps({"code": SMALL_RELU_TASK.read_text()}) + "\n")
    result = run_cli(cli, cli_env, "tasks", "list", tmp_path, "--no-import-check", timeout_s=120)
    assert result.returncode == 2, result.stdout
    flat = one_line(result.stderr)
    assert "no problem files (*.py) in this folder" in flat
    assert f"{tmp_path / 'level1'}/" in flat and str(tmp_path / "sample" / "tasks.jsonl") in flat


def test_tables_off_a_terminal_keep_names_whole(cli, cli_env, tmp_path: Path) -> None:
    """Piped, with no COLUMNS set, a name wider than a third of the old 120 columns beside a long
    error stays on one line (it was folded: "add_relu_m / ul")."""
    name = "a_task_whose_name_is_long_enough_to_be_folded_in_a_narrow_table_of_three_columns"
    (tmp_path / f"{name}.py").write_text("def get_inputs(): return []\ndef get_init_inputs(): return []\n")
    env = {key: value for key, value in cli_env.items() if key != "COLUMNS"}
    result = run_cli(cli, env, "tasks", "list", tmp_path, "--no-import-check", timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert name in result.stdout and "missing top-level Model" in one_line(result.stdout)


# -- demo --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_on_cpu_evaluates_every_sample_and_exits_0(cli, cli_env, fast_config_file) -> None:
    result = run_cli(cli, cli_env, "demo", "--device", "cpu", "--no-compile-baseline", "--config", fast_config_file,
                     timeout_s=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for task in sorted(p.stem for p in (EXAMPLES / "tasks").glob("*.py")):
        assert task in out
    assert "workdir" in out and "single-file" in out
    assert "correct" in out and "failed" not in result.stderr
    assert "…" not in out, "a table cell was cut instead of wrapped"
    steps = re.findall(r"^\[\s*\d+\.\d s\] (.+): (\d+)/(\d+)$", result.stderr, flags=re.M)
    assert steps[0] == ("building samples in parallel", "0", steps[0][2]), "no line as the (cold) builds begin"
    assert ("building samples in parallel", "1", steps[0][2]) in steps, "no plain progress line when not a terminal"
    assert steps[-1][1] == steps[-1][2], "the last evaluation step was not reported"


@pytest.mark.slow
def test_demo_json_tells_each_sample_apart_by_layout_and_solution(cli, cli_env, fast_config_file,
                                                                 tmp_path: Path) -> None:
    """Both layouts of one task: two verdicts of the same task that only these fields tell apart."""
    (tmp_path / "tasks").mkdir()
    shutil.copy(SMALL_RELU_TASK, tmp_path / "tasks" / "relu.py")
    (tmp_path / "solutions" / "cpu").mkdir(parents=True)
    shutil.copy(EXAMPLES / "solutions" / "cpu" / "relu.py", tmp_path / "solutions" / "cpu" / "relu.py")
    shutil.copytree(EXAMPLES / "solutions" / "cpu_workdir" / "relu", tmp_path / "solutions" / "cpu_workdir" / "relu")
    result = run_cli(cli, cli_env, "demo", "--device", "cpu", "--no-compile-baseline", "--config", fast_config_file,
                     "--examples", tmp_path, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    entries = json.loads(result.stdout)
    assert [(e["task"], e["layout"], e["correct"]) for e in entries] == [("relu", "single-file", True),
                                                                        ("relu", "workdir", True)]
    assert [Path(e["solution"]) for e in entries] == [tmp_path / "solutions" / "cpu" / "relu.py",
                                                      tmp_path / "solutions" / "cpu_workdir" / "relu"]


def test_the_command_parent_never_imports_torch_to_verify(cli_env) -> None:
    """`cuda-agent verify` (and every other command's parent) starts without torch: its seconds of
    import belong to the workers, which have it loaded before the evaluation needs them."""
    import sys

    probe = ("import sys, cuda_agent.cli, cuda_agent.environment.evaluator, cuda_agent.cli_support as s; "
             "s.default_device(); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=cli_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"

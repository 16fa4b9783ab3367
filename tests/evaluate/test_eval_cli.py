"""``cuda-agent eval`` and ``cuda-agent report`` end to end on the CPU backend: a run killed
mid-way continues without re-evaluating finished tasks, ``--json`` carries the metrics, reports are
written, and bad usage exits 2 naming the problem."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.agent.trajectory import read_trajectories
from cuda_agent.cli import app
from cuda_agent.evaluate.store import ResultsStore

from support import EXAMPLES, FIXTURES, SMALL_RELU_TASK, descendants, is_live, wait_until

RECORDED_CPU_EPISODE = FIXTURES / "agent" / "rmsnorm_cpu.jsonl"


def files_written(episode: Path) -> dict[str, str]:
    """The last content each ``write_file`` call of a recorded episode gave each path."""
    files = {}
    for message in next(read_trajectories(episode)).messages:
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            if call["function"]["name"] == "write_file":
                files[arguments["path"]] = arguments["content"]
    return files


def stored_rows(store: Path) -> dict[str, tuple[str, float]]:
    if not store.exists():
        return {}
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
        try:
            return {key: (status, at) for key, status, at in db.execute("SELECT task_key, status, finished_at FROM results")}
        except sqlite3.OperationalError:  # the table is not created yet
            return {}


@pytest.fixture()
def small_suite(tmp_path: Path, fault_solution) -> tuple[Path, Path]:
    """Four tasks (copies of small_relu): two honest solutions sharing one build, one that the
    static guards reject, and one missing."""
    tasks, solutions = tmp_path / "tasks", tmp_path / "solutions"
    tasks.mkdir()
    solutions.mkdir()
    for name in ("a", "b", "d", "e"):
        shutil.copy(SMALL_RELU_TASK, tasks / f"{name}.py")
    honest = fault_solution("relu_ok")
    for name in ("a", "b"):
        shutil.copytree(honest, solutions / name)
    (solutions / "e.py").write_text("import torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                                    "class ModelNew(nn.Module):\n    def forward(self, x):\n        return F.relu(x)\n")
    return tasks, solutions


def test_killed_run_continues_without_reevaluating_finished_tasks_then_reports(
        small_suite, tmp_path: Path, cli, cli_env, fast_config_file) -> None:
    tasks, solutions = small_suite
    run = tmp_path / "run"
    command = [*cli, "eval", "--tasks", str(tasks), "--solutions", str(solutions), "--out", str(run), "--device", "cpu",
               "--no-compile-baseline", "--config", str(fast_config_file), "--workers", "1"]
    first = subprocess.Popen(command, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    store = run / "results.sqlite"
    assert wait_until(lambda: any(s == "correct" for s, _ in stored_rows(store).values()), timeout_s=600), \
        first.stderr.read() if first.poll() is not None else "no correct result within 600 s"
    workers = descendants(first.pid)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = stored_rows(store)
    assert len(before) < 4, "the run finished before it could be killed"
    assert workers, "the run had started no worker process"
    assert wait_until(lambda: not [pid for pid in workers if is_live(pid)], timeout_s=30), \
        "the killed run left processes behind"

    second = subprocess.run([*command, "--json"], env=cli_env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr
    assert f"{len(before)} already done" in " ".join(second.stderr.split())
    after = stored_rows(store)
    assert {key: after[key] for key in before} == before, "a finished task was evaluated again"
    data = json.loads(second.stdout)
    overall = data["overall"]
    assert (overall["n_tasks"], overall["n_correct"], overall["n_missing"]) == (4, 2, 1)
    assert overall["pass_rate"] == 0.5
    assert overall["geomean_speedup_vs_eager"] > 0 and overall["faster_rate_vs_compile"] is None
    assert sorted(data) == ["overall", "run"] and data["run"]["device"] == "cpu"
    assert data["run"]["preset"] == "strict" and "milestone speedup" in data["run"]["protocol"]
    assert {key: status for key, (status, _) in after.items()} == {
        "a": "correct", "b": "correct", "d": "missing", "e": "guard_violation"}

    report = subprocess.run([*cli, "report", str(run)], env=cli_env, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    html, summary = (run / "report.html").read_text(), (run / "summary.md").read_text()
    assert "<svg" in html and "href='verdicts/run/a.json'" in html and "guard_violation" in html
    assert re.search(r"<td>d</td><td>[^<]*</td><td><span class='failed'>missing</span></td><td>[^<]+</td><td>-1</td>",
                     html), "a missing solution needs its reason shown and reward -1"
    assert re.search(r"guard_violation</span></td><td>[^<]+</td><td>-1</td>", html)
    assert json.loads((run / "verdicts" / "run" / "a.json").read_text())["status"] == "correct"
    assert "| overall | 4 | 1 | 50.0% |" in summary and "Evaluations per worker: cpu:0: 3." in summary
    compared = subprocess.run([*cli, "report", str(run), "--compare", str(run), "--out", str(tmp_path / "cmp")],
                              env=cli_env, capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0, compared.stderr
    assert "| overall (run) | 4 |" in (tmp_path / "cmp" / "summary.md").read_text()
    assert "| overall (run-compared) | 4 |" in (tmp_path / "cmp" / "summary.md").read_text()
    assert (tmp_path / "cmp" / "summary.md").read_text().count("Verdicts: preset strict: precision faithful") == 2


def test_sigterm_stops_a_run_at_once_keeping_what_is_stored(tmp_path: Path, fault_solution, cli, cli_env,
                                                           fast_config_file) -> None:
    # Two lanes: task a is judged while task z's candidate sleeps at import (its timeout is minutes
    # away); then the run gets SIGTERM, as a batch scheduler or a timeout sends it.
    tasks, solutions, run = tmp_path / "tasks", tmp_path / "solutions", tmp_path / "run"
    tasks.mkdir()
    solutions.mkdir()
    for name, fault in (("a", "relu_ok"), ("z", "sleep_at_import")):
        shutil.copy(SMALL_RELU_TASK, tasks / f"{name}.py")
        shutil.copytree(fault_solution(fault), solutions / name)
    command = [*cli, "eval", "--tasks", str(tasks), "--solutions", str(solutions), "--out", str(run), "--device", "cpu",
               "--no-compile-baseline", "--config", str(fast_config_file), "--workers", "2"]
    first = subprocess.Popen(command, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    store = run / "results.sqlite"
    assert wait_until(lambda: "a" in stored_rows(store), timeout_s=600), \
        first.stderr.read() if first.poll() is not None else "task a had no result within 600 s"
    workers = descendants(first.pid)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 130, first.stderr.read()
    assert "interrupted: 1 of 2 tasks have results" in " ".join(first.stderr.read().split())
    assert set(stored_rows(store)) == {"a"}, "the interrupted job was stored as if it had a result"
    assert wait_until(lambda: not [pid for pid in workers if is_live(pid)], timeout_s=30), \
        "the interrupted run left processes behind"


def test_continuing_a_run_with_other_settings_is_refused(small_suite, tmp_path: Path) -> None:
    tasks, solutions = small_suite
    run = tmp_path / "run"
    ResultsStore(run / "results.sqlite").start_run("run", {"evaluation": "other"}, {})
    result = CliRunner().invoke(app, ["eval", "--tasks", str(tasks), "--solutions", str(solutions), "--out", str(run),
                                      "--device", "cpu"], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "started with other settings" in " ".join(result.stderr.split())


@pytest.mark.parametrize("args, message", [
    (["--tasks", "{tmp}/absent", "--solutions", "{solutions}"], "absent: no such file or directory"),
    (["--tasks", "{tasks}"], "give exactly one of --solutions DIR"),
    (["--tasks", "{tasks}", "--solutions", "{solutions}", "--policy", "p"], "give exactly one of --solutions DIR"),
    (["--tasks", "{tasks}", "--policy", "openai:model"], "unknown policy 'openai:model'"),
    (["--tasks", "{tasks}", "--solutions", "{tmp}"], "no solution matches any task"),
    (["--tasks", "{tasks}", "--level", "1", "--solutions", "{solutions}"], "--level needs a KernelBench checkout"),
    (["--tasks", "{tasks}", "--solutions", "{solutions}", "--backend", "slurm"], "pool.backend must be one of"),
])
def test_bad_eval_usage_exits_2_naming_the_problem(small_suite, tmp_path: Path, args, message) -> None:
    """In process (these fail before any evaluation starts)."""
    tasks, solutions = small_suite
    filled = [a.format(tmp=tmp_path, tasks=tasks, solutions=solutions) for a in args]
    result = CliRunner().invoke(app, ["eval", *filled, "--device", "cpu", "--out", str(tmp_path / "run")],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())


def test_report_of_a_folder_without_results_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "no results store" in result.stderr


@pytest.mark.slow  # one rmsnorm agent episode (build cached by the samples tests), then its evaluation
def test_a_policy_is_evaluated_on_the_solution_its_agent_wrote(cli, cli_env, fast_config_file, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copy(EXAMPLES / "tasks" / "rmsnorm.py", tasks / "rmsnorm.py")
    args = [*cli, "eval", "--tasks", str(tasks), "--policy", "replay", "--replay", str(RECORDED_CPU_EPISODE),
            "--device", "cpu", "--config", str(fast_config_file), "--out", str(tmp_path / "run"), "--json"]
    proc = subprocess.run(args, env=cli_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    overall = json.loads(proc.stdout)["overall"]
    # Correct and timed against eager. Whether it is >5 % faster is left out: with a 0.3 s timing budget
    # on a busy 2-core machine its speed-up was 1.16x to 28x in runs here, and under 1.05x in two CI runs.
    assert overall["n_tasks"] == 1 and overall["pass_rate"] == 1.0 and overall["n_timed_vs_eager"] == 1
    solution = tmp_path / "run" / "solutions" / "rmsnorm"
    assert (solution / "report.json").exists()
    for path, content in files_written(RECORDED_CPU_EPISODE).items():  # the files the agent wrote, as written
        assert (solution / path).read_text() == content, path
    again = subprocess.run(args, env=cli_env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "0 of 1 tasks to solve" in again.stderr  # resumed: no second episode


def test_tasks_check_judges_each_reference_as_its_own_candidate_and_resumes(cli, cli_env, fast_config_file,
                                                                             tmp_path: Path) -> None:
    """The self-check on the CPU backend: the reference, handed over as ``ModelNew``, comes out
    correct with the guards off; the row carries its sizes, memory and baselines; a rerun finds it
    done."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copy(SMALL_RELU_TASK, tasks)
    config = tmp_path / "check.yaml"
    config.write_text(fast_config_file.read_text() + "  compile_baseline: false\n")
    command = [*cli, "tasks", "check", str(tasks), "--device", "cpu", "--config", str(config),
               "--out", str(tmp_path / "check"), "--json", "--prestart-slots", "0"]
    done = subprocess.run(command, capture_output=True, text=True, env=cli_env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    [row] = report["problems"]
    assert row["status"] == "correct" and report["counts"] == {"correct": 1} and report["run"]["selfcheck"]
    assert row["input_gb"] == 64 * 256 * 4 / 1e9 and row["output_gb"] == row["input_gb"]
    assert row["baseline_ms"]["eager_tf32_off"] > 0 and row["memory_mb"]["reference"]["peak_host_mb"] > 0
    assert "verify" in row["phase_seconds"] and row["prestarted"] is False  # --prestart-slots 0 reached the lane
    assert row["timed_cpus"] == "not set apart"  # the CPU backend times on torch's own threads
    assert row["worker"] and row["device_turns"] == []  # the lane that judged it; a GPU of its own: no turns
    loops = row["timing_loops"]  # how far each timing loop got: the baseline's and the candidate's
    assert set(loops) == {"eager_tf32_off", "candidate"}
    assert all(loop["n"] >= 3 and loop["calls_per_sample"] >= 1 and 0 <= loop["rel_std_err"] < 1 for loop in loops.values())
    # timed now (seconds for each variant) or from the suite's shared cache (none)
    timed = {v for v, source in row["baseline_sources"].items() if source == "timed"}
    assert set(row["baseline_sources"]) == {"eager_tf32_off"} and set(row["baseline_seconds"]) == timed
    assert all(seconds > 0 for seconds in row["baseline_seconds"].values())
    again = subprocess.run(command, capture_output=True, text=True, env=cli_env, timeout=600)
    assert again.returncode == 0 and "1 already done" in again.stderr, again.stderr[-2000:]

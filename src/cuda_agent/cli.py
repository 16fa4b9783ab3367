"""The ``cuda-agent`` command line. Library code returns typed results; presentation lives here."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from cuda_agent.agent.cli import agent_app, optimize, traj_app
from cuda_agent.cli_cache import cache_app
from cuda_agent.cli_output import CliApp, WrappingTable, step_progress
from cuda_agent.cli_support import (
    PRESET_HELP, build_eval_config, console, err_console, fail_usage, require_local_device,
)
from cuda_agent.environment import (
    POLICIES, EvalConfig, Task, TaskLoadError, Verdict, evaluate, load_solution, load_task, load_tasks,
)
from cuda_agent.environment.build import build_many
from cuda_agent.evaluate.cli import eval_command, report_command, tasks_check_command
from cuda_agent.serve.cli import serve_command
from cuda_agent.synth.cli import synth_app
from cuda_agent.train.cli import train_app
from cuda_agent.warm import WarmError, evaluate_warm
from cuda_agent.warm.cli import warm_app

app = CliApp(add_completion=False, no_args_is_help=True,
             help="Agentic RL for CUDA kernels: evaluate candidates with a hack-resistant reward.")
tasks_app = CliApp(no_args_is_help=True, help="Inspect task sets (KernelBench folders, datasets).")
app.add_typer(tasks_app, name="tasks")
tasks_app.command("check")(tasks_check_command)
app.add_typer(synth_app, name="synth")
app.add_typer(agent_app, name="agent")
app.add_typer(traj_app, name="traj")
app.add_typer(train_app, name="train")
app.command()(optimize)


def _print_version(value: bool) -> None:
    if value:
        from cuda_agent import __version__

        print(f"cuda-agent {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")) -> None:
    """Agentic RL for CUDA kernels: evaluate candidates with a hack-resistant reward."""
app.command("eval")(eval_command)
app.command("report")(report_command)
app.command("serve")(serve_command)
app.add_typer(warm_app, name="warm")
app.add_typer(cache_app, name="cache")


def _fmt(value: Optional[float], unit: str = "") -> str:
    return "—" if value is None else f"{value:.4g}{unit}"


def _verdict_table(verdict: Verdict) -> Table:
    table = WrappingTable(title=f"{verdict.task}: {verdict.status.value}", show_header=False)
    rows = [
        ("reward", str(verdict.reward)),
        ("compiled / correct", f"{verdict.compiled} / {verdict.correct}"),
        ("preset", verdict.preset),
        ("precision policy", _precision_label(verdict)),
        ("candidate", _fmt(verdict.candidate_ms, " ms")),
        ("eager", _fmt(verdict.eager_ms, " ms")),
        ("torch.compile", _fmt(verdict.compile_ms, " ms")),
        ("speed-up vs eager", _fmt(verdict.speedup_vs_eager, "x")),
        ("speed-up vs compile", _fmt(verdict.speedup_vs_compile, "x")),
        ("trials passed", f"{sum(t.passed for t in verdict.trials)}/{len(verdict.trials)}"),
        ("build", "—" if verdict.build is None else f"{verdict.build.seconds:.1f} s" + (" (cached)" if verdict.build.cached else "")),
        ("device", _device_label(verdict)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    for violation in verdict.violations:
        table.add_row("[red]violation[/red]", f"{violation.code}: {violation.message}")
    for note in verdict.notes:
        table.add_row("note", note)
    if verdict.error:
        table.add_row("[red]error[/red]", verdict.error[-3000:])
    return table


def _precision_label(verdict: Verdict) -> str:
    """The policy, and on CUDA the TF32 setting of the baselines the reward compares against (the
    CPU has no TF32)."""
    if verdict.device != "cuda":
        return verdict.precision_policy
    return f"{verdict.precision_policy} (speed-ups vs TF32 {verdict.reward_baseline.replace('tf32_', '')})"


def _device_label(verdict: Verdict) -> str:
    """``cpu`` or ``cuda`` in every verdict, with the hardware when a worker reported it (a
    verdict that ended before the workers loaded has none)."""
    hardware = verdict.environment.get("gpu") or verdict.environment.get("cpu")
    return f"{verdict.device} ({hardware})" if hardware else verdict.device


@app.command()
def verify(
    problem: Path = typer.Argument(..., help="KernelBench-format problem file (class Model, get_inputs, get_init_inputs)."),
    solution: Path = typer.Argument(..., help="Single-file ModelNew solution, or an agent workdir (model_new.py + kernels/)."),
    device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if a GPU is visible, else cpu)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (the stable contract) instead of a table."),
    precision: Optional[str] = typer.Option(None, help=f"Precision policy: {', '.join(POLICIES.names())} (default faithful)."),
    trials: Optional[int] = typer.Option(None, help="Standard correctness trials with fresh secret seeds (>= 5)."),
    compile_baseline: Optional[bool] = typer.Option(None, "--compile-baseline/--no-compile-baseline",
                                                    help="Time torch.compile too (needed for reward 3)."),
    config: Optional[Path] = typer.Option(None, help="YAML config with sections build, verify, timing, limits."),
    preset: Optional[str] = typer.Option(None, help=PRESET_HELP),
    keep_warm: bool = typer.Option(False, "--keep-warm", envvar="CUDA_AGENT_KEEP_WARM",
                                   help="Evaluate in this user's background evaluator for these settings (started "
                                        "on first use; exits after $CUDA_AGENT_KEEP_WARM_IDLE_S idle seconds, "
                                        "default 600, or on `cuda-agent warm stop`). Same verdict, without starting "
                                        "the workers: on a GPU host it starts the next call's while a call runs "
                                        "(seconds less per call); on the CPU backend only after each verdict (they "
                                        "would take the cores the timing runs on), so a call gains their start "
                                        "(about 2.5 of 7 s on 2 cores) only when it comes that long after the "
                                        "previous one, and calls back to back gain nothing."),
) -> None:
    """Build, verify and profile one candidate; print its verdict and reward.

    Exit status 0 whenever a verdict was reached (pass or fail: a solution that does not parse is a
    verdict, reward -1), 2 on bad usage or an unreadable problem.
    """
    eval_config = build_eval_config(device, config, precision, trials, compile_baseline, preset)
    require_local_device(eval_config)
    try:
        task = load_task(problem)
    except TaskLoadError as exc:
        fail_usage(str(exc))
    if not solution.exists():
        fail_usage(f"{solution}: no such file or directory")
    with console.status(f"evaluating {solution.name} on {task.id} ({eval_config.device})", spinner="dots") \
            if not json_out else contextlib.nullcontext():
        verdict = _evaluate_once(problem, task, solution, eval_config, keep_warm)
    if json_out:
        print(json.dumps(verdict.to_json_dict(), default=str, allow_nan=False))
    else:
        console.print(_verdict_table(verdict))


def _evaluate_once(problem: Path, task: Task, solution: Path, config: EvalConfig, keep_warm: bool) -> Verdict:
    """In this process, or by the keep-warm evaluator (falling back to this process, with a warning,
    when it cannot give a verdict)."""
    if keep_warm:
        try:
            return evaluate_warm(problem, solution, config)
        except WarmError as exc:
            err_console.print(f"[yellow]warning:[/yellow] {escape(str(exc))}; evaluating in this process")
    return evaluate(task, solution, config)


@tasks_app.command("list")
def tasks_list(
    path: Path = typer.Argument(..., help="A problem file, a directory of them (e.g. KernelBench/level1), or a .parquet/.jsonl dataset."),
    import_check: bool = typer.Option(True, "--import-check/--no-import-check",
                                      help="Also import each task in a worker process to catch import-time failures."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list of {id, origin, error} instead of a table."),
    failed_only: bool = typer.Option(False, "--failed", help="List only the entries that fail to load (large datasets)."),
) -> None:
    """Show which tasks load and which do not, and why (dataset rows by their id and row); failures
    that repeat are summarised by cause."""
    from cuda_agent.environment.probe import probe_tasks

    try:
        results = load_tasks(path)
    except TaskLoadError as exc:
        fail_usage(str(exc))
    import_errors: dict[str, str] = {}
    if import_check:
        loaded = [r.task for r in results if r.task is not None]
        with console.status(f"importing {len(loaded)} tasks in a worker process"):
            import_errors = probe_tasks(loaded)
    rows = [(result.task.id if result.task else Path(result.origin).name, result.origin,
             result.error or (import_errors.get(result.task.origin) if result.task else None)) for result in results]
    shown = [row for row in rows if row[2] is not None or not failed_only]
    if json_out:
        print(json.dumps([{"id": name, "origin": origin, "error": error} for name, origin, error in shown]))
        return
    table = WrappingTable(title=f"{path}: {len(results)} entries")
    for column in ("id", "status", "detail"):
        table.add_column(column)
    for name, _, error in shown:
        table.add_row(name, "[green]ok[/green]" if error is None else "[red]failed[/red]", escape(error or ""))
    console.print(table)
    causes = Counter(_failure_cause(error, origin) for _, origin, error in rows if error is not None)
    console.print(f"{len(rows) - sum(causes.values())} of {len(rows)} loaded")
    for cause, count in causes.most_common():
        if count > 1:
            hint = next((f" (pip install 'cuda-agent[{extra}]')" for module, extra in _EXTRA_OF_MODULE.items()
                         if f"No module named '{module}'" in cause), "")
            console.print(f"  {count} failed with: {cause}{hint}", markup=False, highlight=False, soft_wrap=True)


_EXTRA_OF_MODULE = {"transformers": "hf", "pyarrow": "parquet"}
"""Modules that tasks of the shipped datasets import, and the extra that installs each."""


def _failure_cause(error: str, origin: str) -> str:
    """An error without the task it happened in, so that one cause shared by many tasks is counted once."""
    return error.removeprefix(f"{origin}: ").strip().splitlines()[-1]


@dataclass(frozen=True)
class _SampleRun:
    task: str
    layout: str
    solution: Path
    task_file: Path


def examples_dir() -> Path:
    """The bundled samples: inside the installed package, or the source checkout's ``examples/``."""
    packaged = Path(__file__).resolve().parent / "examples"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "examples"


def _sample_runs(root: Path, device: str) -> list[_SampleRun]:
    runs = []
    for task_file in sorted((root / "tasks").glob("*.py")):
        single = root / "solutions" / device / f"{task_file.stem}.py"
        workdir = root / "solutions" / f"{device}_workdir" / task_file.stem
        for layout, path in (("single-file", single), ("workdir", workdir)):
            if path.exists():
                runs.append(_SampleRun(task_file.stem, layout, path, task_file))
    return runs


@app.command()
def demo(
    device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if a GPU is visible, else cpu)."),
    examples: Optional[Path] = typer.Option(None, help="Samples folder with tasks/ and solutions/<device>[_workdir]/."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list of verdicts, each with its sample's "
                                                        "layout and solution path, instead of a table."),
    compile_baseline: Optional[bool] = typer.Option(None, "--compile-baseline/--no-compile-baseline",
                                                    help="Time torch.compile too (needed for reward 3)."),
    config: Optional[Path] = typer.Option(None, help="YAML config with sections build, verify, timing, limits."),
    preset: Optional[str] = typer.Option(None, help=PRESET_HELP),
) -> None:
    """Evaluate every bundled sample task with its bundled reference solution, end to end."""
    eval_config = build_eval_config(device, config, compile_baseline=compile_baseline, preset=preset)
    require_local_device(eval_config)
    root = examples or examples_dir()
    runs = _sample_runs(root, eval_config.device)
    if not runs:
        fail_usage(f"{root}: no sample tasks with solutions for device {eval_config.device!r}")
    verdicts: list[tuple[_SampleRun, Verdict]] = []
    with step_progress(disable=json_out) as progress:
        building = progress.add_task("building samples in parallel", total=len(runs))
        build_many([load_solution(r.solution) for r in runs], eval_config.device, eval_config.build,
                   eval_config.cache_dir, on_done=lambda _: progress.advance(building),
                   sandbox_config=eval_config.sandbox)
        bar = progress.add_task("evaluating samples", total=len(runs))
        for run in runs:
            progress.update(bar, description=f"{run.task} ({run.layout})")
            verdicts.append((run, evaluate(load_task(run.task_file), run.solution, eval_config)))
            progress.advance(bar)
    if json_out:
        print(json.dumps([{**v.to_json_dict(), "layout": run.layout, "solution": str(run.solution)}
                          for run, v in verdicts], default=str, allow_nan=False))
        return
    table = WrappingTable(title=f"sample tasks on {eval_config.device} (preset {eval_config.preset}, "
                                f"precision {eval_config.verify.precision})")
    for column in ("task", "layout", "status", "reward", "candidate ms", "eager ms", "compile ms",
                   "vs eager", "vs compile", "build s"):
        table.add_column(column, justify="right" if column not in ("task", "layout", "status") else "left")
    for run, v in verdicts:
        table.add_row(run.task, run.layout, v.status.value, str(v.reward), _fmt(v.candidate_ms), _fmt(v.eager_ms),
                      _fmt(v.compile_ms), _fmt(v.speedup_vs_eager, "x"), _fmt(v.speedup_vs_compile, "x"),
                      "—" if v.build is None else f"{v.build.seconds:.1f}" + (" (cached)" if v.build.cached else ""))
    console.print(table)
    failed = [(run, v) for run, v in verdicts if not v.correct]
    for run, v in failed:
        err_console.print(f"[red]{run.task} ({run.layout}) failed:[/red] {v.error}")
    if failed:
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

"""``cuda-agent eval`` and ``cuda-agent report``: benchmark numbers for a folder of solutions or a
policy, and the pages that present them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import TimeRemainingColumn
from rich.table import Table

from cuda_agent.agent.cli import AGENT_OPTIONS
from cuda_agent.agent.policies import POLICIES as AGENT_POLICIES
from cuda_agent.agent.policies import PolicySpec
from cuda_agent.cli_output import BAR_COLUMNS, WrappingTable, step_progress
from cuda_agent.cli_support import (
    PRESET_HELP, build_eval_config, console, err_console, fail_usage, require_local_device,
)
from cuda_agent.environment import POLICIES, EvalConfig
from cuda_agent.environment.presets import describe
from cuda_agent.evaluate.metrics import GroupMetrics, benchmark_metrics
from cuda_agent.evaluate.policy import DEFAULT_TURNS
from cuda_agent.evaluate.store import HARNESS_ERROR, STORE_FILE, ResultRecord, ResultsStore, StoreError
from cuda_agent.evaluate.tasks import EvalTask, SolutionMatch, TaskSetError, load_task_set, match_solutions
from cuda_agent.pool import BACKENDS, PoolConfig, PoolConfigError, open_pool

EXIT_INCOMPLETE = 1


def _pool_config(backend: str, address: Optional[str], token: Optional[str], workers: int, gpus: Optional[str],
                 compile_workers: int) -> PoolConfig:
    try:
        return PoolConfig(backend=backend, address=address, token=token, workers=workers, compile_workers=compile_workers,
                          gpus=tuple(g.strip() for g in gpus.split(",")) if gpus else ())
    except PoolConfigError as exc:
        fail_usage(str(exc))


def _solutions_for(tasks: list[EvalTask], solutions: Optional[Path], policy: Optional[PolicySpec],
                   agent: dict[str, Any], episodes: int, out: Path, config: EvalConfig, solution_rule: str) -> Path:
    """The folder of solutions to evaluate: the given one, or the one the agent fills for a policy."""
    if solutions is not None:
        return solutions
    if episodes < 1:
        fail_usage(f"--episodes must be >= 1, got {episodes}")
    from cuda_agent.agent import AgentConfig, AgentConfigError
    from cuda_agent.agent.optimize import SOLUTION_RULES
    from cuda_agent.evaluate.policy import run_agent, tasks_without_solution

    if solution_rule not in SOLUTION_RULES:
        fail_usage(f"--solution {solution_rule!r} is unknown; valid: {', '.join(SOLUTION_RULES.names())}")
    folder = out / "solutions"
    todo = tasks_without_solution(tasks, folder)
    err_console.print(f"agent: {len(todo)} of {len(tasks)} tasks to solve with the {policy.name} policy "
                      f"({agent['max_turns']} turns each, {episodes} episodes at once; scored solution: {solution_rule})")
    try:
        failures = run_agent(todo, policy, AgentConfig.from_dict(agent, "agent options"), folder, config, episodes,
                             solution_rule)
    except (AgentConfigError, ValueError) as exc:  # a policy that cannot be made (bad model, endpoint, script)
        fail_usage(f"cannot run the {policy.name} policy: {exc}")
    for key, error in failures:
        err_console.print(f"[yellow]agent episode for {key} failed ({error}); it counts as failed, a rerun retries it")
    return folder


def eval_command(
    tasks: Path = typer.Option(..., help="KernelBench checkout (or one of its level folders), a folder of problem "
                                         "files, or a .parquet/.jsonl dataset."),
    level: Optional[list[int]] = typer.Option(None, help="KernelBench level to evaluate (repeatable; default: 1, 2 and 3, "
                                                           "as the paper reports; --level 4 adds level 4)."),
    solutions: Optional[Path] = typer.Option(None, help="Folder with one solution per task: level{L}_problem{N}.py "
                                                        "or <task id>.py (or a workdir folder of that name)."),
    policy: Optional[str] = typer.Option(None, help=f"Evaluate a policy ({', '.join(AGENT_POLICIES.names())}): the "
                                                    "agent writes the solutions first."),
    model: Optional[str] = AGENT_OPTIONS["model"],
    base_url: Optional[str] = AGENT_OPTIONS["base_url"],
    replay: Optional[Path] = AGENT_OPTIONS["replay"],
    tool_protocol: str = AGENT_OPTIONS["tool_protocol"],
    turns: int = typer.Option(DEFAULT_TURNS, help="Agent turns per task with --policy."),
    episodes: int = typer.Option(8, help="Agent episodes at once with --policy (they share one evaluation queue)."),
    solution: str = AGENT_OPTIONS["solution"],
    workdir_style: Optional[str] = AGENT_OPTIONS["workdir_style"], skill: Optional[Path] = AGENT_OPTIONS["skill"],
    out: Optional[Path] = typer.Option(None, help="Run folder (results store, reports); rerunning continues it "
                                                  "[default: runs/eval-<solutions folder name>]."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object of metrics per level and overall."),
    device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if a GPU is visible, else cpu)."),
    precision: Optional[str] = typer.Option(None, help=f"Precision policy: {', '.join(POLICIES.names())}."),
    compile_baseline: Optional[bool] = typer.Option(None, "--compile-baseline/--no-compile-baseline",
                                                    help="Time torch.compile (needed for the vs-compile metrics)."),
    config: Optional[Path] = typer.Option(None, help="YAML config with sections build, verify, timing, limits."),
    preset: Optional[str] = typer.Option(None, help=PRESET_HELP),
    backend: str = typer.Option("local", help=f"Where evaluations run: {', '.join(BACKENDS)}."),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (ray) or service URL (service)."),
    token: Optional[str] = typer.Option(None, envvar="CUDA_AGENT_SERVE_TOKEN", help="Bearer token (service)."),
    workers: int = typer.Option(0, help="Evaluation workers (0: one per GPU; 1 on cpu)."),
    gpus: Optional[str] = typer.Option(None, help="GPUs to use, e.g. 0,1 (default: all visible)."),
    compile_workers: int = typer.Option(0, help="Concurrent builds ahead of evaluation (0: one per CPU core)."),
) -> None:
    """Evaluate a folder of solutions (or a policy) on a task set: pass rate, faster rates and
    geomean speed-ups vs eager and torch.compile, per level and overall. Resumable.

    Exit status 0 when every task has a result, 1 when some could not be evaluated (rerun to retry
    them), 2 on bad usage.
    """
    eval_config = build_eval_config(device, config, precision, compile_baseline=compile_baseline, preset=preset)
    pool_config = _pool_config(backend, address, token, workers, gpus, compile_workers)
    if pool_config.backend == "local":
        require_local_device(eval_config)
    levels = tuple(sorted(set(level or ())))
    try:
        task_set = load_task_set(tasks, levels)
    except TaskSetError as exc:
        fail_usage(str(exc))
    run_dir = out or Path("runs") / f"eval-{(solutions or Path('policy')).resolve().name}"
    if (solutions is None) == (policy is None):
        fail_usage("give exactly one of --solutions DIR (evaluate a folder) or --policy NAME (run the agent first)")
    spec = None
    if policy is not None:
        if policy not in AGENT_POLICIES:
            fail_usage(f"unknown policy {policy!r}; valid: {', '.join(AGENT_POLICIES.names())}")
        spec = PolicySpec(policy, model=model, base_url=base_url, replay=replay, tool_protocol=tool_protocol)
    agent = {"max_turns": turns, **{k: v for k, v in {"workdir_style": workdir_style, "skill_path": skill}.items()
                                    if v is not None}}
    solutions_dir = _solutions_for(task_set, solutions, spec, agent, episodes, run_dir, eval_config, solution)
    try:
        match = match_solutions(task_set, solutions_dir)
    except TaskSetError as exc:
        fail_usage(str(exc))
    store = _open_run(run_dir, task_set, match, tasks, levels, solutions_dir, policy, eval_config, pool_config)
    _evaluate_with_progress(store, run_dir, task_set, match, eval_config, pool_config, json_out)
    records = store.records(run_dir.name)
    metrics = benchmark_metrics([r.outcome() for r in records])
    if json_out:
        print(json.dumps(metrics_json(metrics, store.run(run_dir.name).info, run_dir), allow_nan=False))
    else:
        console.print(metrics_table(metrics, f"{run_dir}: {eval_config.device}; {describe(eval_config)}"))
        console.print(f"results: {store.path} (report: cuda-agent report {run_dir})")
    if any(r.status == HARNESS_ERROR for r in records):
        err_console.print("[yellow]some tasks have no verdict (their worker failed); rerun the same command to "
                          "retry them[/yellow]")
        raise typer.Exit(EXIT_INCOMPLETE)


def _open_run(run_dir: Path, task_set: list[EvalTask], match: SolutionMatch, tasks: Path, levels: tuple[int, ...],
              solutions_dir: Path, policy: Optional[str], eval_config: EvalConfig,
              pool_config: PoolConfig) -> ResultsStore:
    """The run's store, with the run started (or checked to continue under the same settings)."""
    from cuda_agent.evaluate.runner import run_settings

    store = ResultsStore(run_dir / STORE_FILE)
    info = {"tasks": str(tasks), "solutions": str(solutions_dir), "policy": policy, "device": eval_config.device,
            "precision": eval_config.verify.precision, "preset": eval_config.preset,
            "protocol": describe(eval_config), "backend": pool_config.backend,
            "unmatched_solutions": [str(p) for p in match.unmatched]}
    try:
        store.start_run(run_dir.name, run_settings(tasks, levels, solutions_dir, task_set, eval_config), info)
    except StoreError as exc:
        fail_usage(str(exc))
    return store


def _evaluate_with_progress(store: ResultsStore, run_dir: Path, task_set: list[EvalTask], match: SolutionMatch,
                            eval_config: EvalConfig, pool_config: PoolConfig, quiet: bool) -> None:
    from cuda_agent.evaluate.runner import evaluate_plans, plan_run, still_to_do

    plans = plan_run(task_set, match.by_task)
    todo = still_to_do(store, run_dir.name, plans)
    _announce(task_set, match, run_dir, len(plans) - len(todo))
    progress = step_progress(*BAR_COLUMNS, TimeRemainingColumn(), disable=quiet)
    with progress:
        bar = progress.add_task("evaluating", total=len(plans), completed=len(plans) - len(todo))
        correct = 0

        def advance(record: ResultRecord) -> None:
            nonlocal correct
            correct += record.correct
            progress.update(bar, advance=1, description=f"evaluating ({correct} correct this session)")

        try:
            with open_pool(eval_config, pool_config) as pool:
                evaluate_plans(store, run_dir.name, todo, pool, advance)
        except PoolConfigError as exc:
            fail_usage(str(exc))


def _announce(task_set: list[EvalTask], match: SolutionMatch, run_dir: Path, done: int) -> None:
    missing = sum(path is None for path in match.by_task.values())
    unloaded = sum(t.task is None for t in task_set)
    err_console.print(f"{len(task_set)} tasks, {match.n_found} solutions ({missing} missing, counted as failed)"
                      + (f", {unloaded} tasks do not load" if unloaded else "")
                      + (f"; continuing {run_dir}: {done} already done" if done else f"; results in {run_dir}"))
    if match.unmatched:
        names = ", ".join(p.name for p in match.unmatched[:5]) + (" ..." if len(match.unmatched) > 5 else "")
        err_console.print(f"[yellow]{len(match.unmatched)} entries of the solutions folder match no task:[/yellow] {names}")


def metrics_json(metrics: dict[str, GroupMetrics], info: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The ``--json`` object: one entry per level and ``overall``, then ``run`` (what was run)."""
    data: dict[str, Any] = {name: group.to_json_dict() for name, group in metrics.items()}
    data["run"] = {"dir": str(run_dir), **info}
    return data


def _pct(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _speed(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.3g}x"


def metrics_table(metrics: dict[str, GroupMetrics], title: str) -> Table:
    table = WrappingTable(title=title)
    for column in ("group", "tasks", "pass", ">eager", ">compile", "geomean/eager", "geomean/compile",
                   "fast_1.5/compile", "fast_2/compile"):
        table.add_column(column, justify="left" if column == "group" else "right")
    for name, group in metrics.items():
        data = group.to_json_dict()
        fast = data["fast_p_vs_compile"] or {}
        table.add_row(name, str(group.n_tasks), _pct(group.pass_rate), _pct(data["faster_rate_vs_eager"]),
                      _pct(data["faster_rate_vs_compile"]), _speed(data["geomean_speedup_vs_eager"]),
                      _speed(data["geomean_speedup_vs_compile"]), _pct(fast.get("1.5")), _pct(fast.get("2")))
    return table


def report_command(
    results: Path = typer.Argument(..., help="A run folder written by `cuda-agent eval` (or its results.sqlite)."),
    run: Optional[str] = typer.Option(None, help="Run name, when the store holds several."),
    compare: Optional[Path] = typer.Option(None, help="A second run folder to put side by side."),
    compare_run: Optional[str] = typer.Option(None, help="Run name in the --compare store."),
    out: Optional[Path] = typer.Option(None, help="Where to write report.html and summary.md [default: the run folder]."),
) -> None:
    """Write a self-contained HTML report and a Markdown summary of an evaluation run."""
    from cuda_agent.evaluate.report import load_run_report, write_reports

    try:
        primary = load_run_report(results, run)
        other = load_run_report(compare, compare_run) if compare is not None else None
    except StoreError as exc:
        fail_usage(str(exc))
    if other is not None and other.name == primary.name:
        other = dataclasses.replace(other, name=f"{other.name}-compared")
    folder = out or (results if results.is_dir() else results.parent)
    html_path, markdown_path = write_reports(primary, other, folder)
    console.print(metrics_table(primary.metrics, f"{primary.name}; {primary.protocol}"))
    if other is not None:
        console.print(metrics_table(other.metrics, f"{other.name}; {other.protocol}"))
    console.print(f"wrote {html_path} and {markdown_path}")

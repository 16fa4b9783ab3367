"""``cuda-agent eval`` and ``cuda-agent report``: benchmark numbers for a folder of solutions or a
policy, and the pages that present them."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
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
    EXIT_INTERRUPTED, PRESET_HELP, build_eval_config, console, err_console, fail_usage, require_local_device,
    sigterm_interrupts,
)
from cuda_agent.environment import POLICIES
from cuda_agent.environment.presets import describe
from cuda_agent.evaluate.metrics import GroupMetrics, benchmark_metrics
from cuda_agent.evaluate.policy import DEFAULT_TURNS
from cuda_agent.evaluate.runner import (
    AgentSpec, RunError, RunEvents, RunSpec, RunSummary, run_benchmark, selfcheck_config,
)
from cuda_agent.evaluate.store import ResultRecord, StoreError
from cuda_agent.pool import BACKENDS, PoolConfig, PoolConfigError

EXIT_INCOMPLETE = 1


LANES_PER_GPU_HELP = ("Evaluations at once on each GPU (local backend): above 1 they overlap their host work, "
                      "time with the GPU to themselves and share it for the rest; for problems far smaller than "
                      "the GPU.")
PRESTART_SLOTS_HELP = ("Worker slots each lane keeps started and warm ahead of its evaluations (local backend; "
                       "default: 3 a CUDA host of 12+ cores, divided among a GPU's lanes; 0: none).")


def _pool_config(backend: str, address: Optional[str], token: Optional[str], workers: int, gpus: Optional[str],
                 compile_workers: int, lanes_per_gpu: int, prestart_slots: Optional[int]) -> PoolConfig:
    try:
        return PoolConfig(backend=backend, address=address, token=token, workers=workers, compile_workers=compile_workers,
                          gpus=tuple(g.strip() for g in gpus.split(",")) if gpus else (), lanes_per_gpu=lanes_per_gpu,
                          prestart_slots=prestart_slots)
    except PoolConfigError as exc:
        fail_usage(str(exc))


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
                                                  "(default: runs/eval-<solutions folder name>)."),
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
    lanes_per_gpu: int = typer.Option(1, help=LANES_PER_GPU_HELP),
    prestart_slots: Optional[int] = typer.Option(None, help=PRESTART_SLOTS_HELP),
    compile_workers: int = typer.Option(0, help="Concurrent builds ahead of evaluation (0: one per CPU core)."),
) -> None:
    """Evaluate a folder of solutions (or a policy) on a task set: pass rate, faster rates and
    geomean speed-ups vs eager and torch.compile, per level and overall. Resumable.

    Exit status 0 when every task has a result, 1 when some could not be evaluated (rerun to retry
    them), 2 on bad usage.
    """
    eval_config = build_eval_config(device, config, precision, compile_baseline=compile_baseline, preset=preset)
    pool_config = _pool_config(backend, address, token, workers, gpus, compile_workers, lanes_per_gpu, prestart_slots)
    if pool_config.backend == "local":
        require_local_device(eval_config)
    if (solutions is None) == (policy is None):
        fail_usage("give exactly one of --solutions DIR (evaluate a folder) or --policy NAME (run the agent first)")
    agent = None
    if policy is not None:
        if policy not in AGENT_POLICIES:
            fail_usage(f"unknown policy {policy!r}; valid: {', '.join(AGENT_POLICIES.names())}")
        options = {"max_turns": turns, **{k: v for k, v in {"workdir_style": workdir_style, "skill_path": skill}.items()
                                          if v is not None}}
        agent = AgentSpec(PolicySpec(policy, model=model, base_url=base_url, replay=replay, tool_protocol=tool_protocol),
                          options, episodes, solution)
    run_dir = out or Path("runs") / f"eval-{(solutions or Path('policy')).resolve().name}"
    spec = RunSpec(run_dir, tasks, tuple(sorted(set(level or ()))), eval_config, pool_config, solutions=solutions,
                   agent=agent)
    summary = run_with_progress(spec, json_out)
    metrics = benchmark_metrics([r.outcome() for r in summary.records])
    if json_out:
        print(json.dumps(metrics_json(metrics, summary.info, run_dir), allow_nan=False))
    else:
        console.print(metrics_table(metrics, f"{run_dir}: {eval_config.device}; {describe(eval_config)}"))
        console.print(f"results: {summary.store_path} (report: cuda-agent report {run_dir})")
    exit_if_incomplete(summary)


def run_with_progress(spec: RunSpec, quiet: bool) -> RunSummary:
    """:func:`run_benchmark` with a progress bar (a line per finished task off a terminal) and its
    messages on stderr; a run that cannot start is a usage error. Ctrl-C or SIGTERM stops it at once
    (the jobs running are dropped, to be judged by a rerun) and exits 130, every stored result kept."""
    progress = step_progress(*BAR_COLUMNS, TimeRemainingColumn(), disable=quiet)
    state = {"bar": None, "correct": 0, "total": 0, "done": 0}

    def start(total: int, done: int) -> None:
        state["bar"] = progress.add_task("evaluating", total=total, completed=done)
        state["total"], state["done"] = total, done

    def result(record: ResultRecord) -> None:
        state["correct"] += record.correct
        state["done"] += 1
        progress.update(state["bar"], advance=1, description=f"evaluating ({state['correct']} correct this session)")

    events = RunEvents(note=lambda message: err_console.print(message, markup=False, highlight=False),
                       start=start, result=result)
    try:
        with sigterm_interrupts(), progress:
            return run_benchmark(spec, events)
    except RunError as exc:
        fail_usage(str(exc))
    except KeyboardInterrupt:
        err_console.print(f"[yellow]interrupted: {state['done']} of {state['total']} tasks have results in "
                          f"{spec.run_dir}; run the same command again to continue[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def exit_if_incomplete(summary: RunSummary) -> None:
    if summary.harness_errors:
        err_console.print("[yellow]some tasks have no verdict (their worker failed); rerun the same command to "
                          "retry them[/yellow]")
        raise typer.Exit(EXIT_INCOMPLETE)


def tasks_check_command(
    tasks: Path = typer.Argument(..., help="KernelBench checkout (or one of its level folders), a folder of problem "
                                           "files, or a .parquet/.jsonl dataset."),
    level: Optional[list[int]] = typer.Option(None, help="KernelBench level to check (repeatable; default: 1, 2 and 3)."),
    out: Optional[Path] = typer.Option(None, help="Run folder (results store); rerunning continues it "
                                                  "(default: runs/check-<task set name>)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: a row per problem and the counts."),
    device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if a GPU is visible, else cpu)."),
    config: Optional[Path] = typer.Option(None, help="YAML config with sections build, verify, timing, limits."),
    workers: int = typer.Option(0, help="Evaluation workers (0: one per GPU; 1 on cpu)."),
    gpus: Optional[str] = typer.Option(None, help="GPUs to use, e.g. 0,1 (default: all visible)."),
    lanes_per_gpu: int = typer.Option(1, help=LANES_PER_GPU_HELP),
    prestart_slots: Optional[int] = typer.Option(None, help=PRESTART_SLOTS_HELP),
) -> None:
    """The harness's self-check: every problem's reference judged as its own candidate, through the
    same workers, trials and timing as any solution (guards off, since the reference is PyTorch).
    A problem that does not come out correct is one the harness cannot judge here. Per problem:
    status, input and output size, each worker's peak memory, eager and torch.compile times with
    TF32 off and on (a baseline table for this GPU), seconds per phase. Resumable.

    Exit status 0 when every problem has a result, 1 when some could not be evaluated (rerun to
    retry them), 2 on bad usage.
    """
    eval_config = selfcheck_config(build_eval_config(device, config, None))
    require_local_device(eval_config)
    pool_config = _pool_config("local", None, None, workers, gpus, 0, lanes_per_gpu, prestart_slots)
    run_dir = out or Path("runs") / f"check-{tasks.resolve().name}"
    spec = RunSpec(run_dir, tasks, tuple(sorted(set(level or ()))), eval_config, pool_config, selfcheck=True)
    started = time.monotonic()
    summary = run_with_progress(spec, json_out)
    rows = [selfcheck_row(record) for record in summary.records]
    counts = dict(Counter(row["status"] for row in rows))
    if json_out:
        print(json.dumps({"problems": rows, "counts": counts, "wall_s": time.monotonic() - started,
                          "run": {"dir": str(run_dir), **summary.info}}, allow_nan=False))
    else:
        console.print(selfcheck_table(rows, f"{run_dir}: self-check on {eval_config.device}"))
        console.print(", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + f" of {len(rows)} problems")
    exit_if_incomplete(summary)


def selfcheck_row(record: ResultRecord) -> dict[str, Any]:
    """One problem of a self-check: its verdict's status, sizes, memory, baselines (where their
    timing went, which loops ran out of budget before reaching their precision target, and how far
    each loop got: samples, calls a sample, relative standard error of the mean and of the median), phases,
    whether its workers were prestarted and which CPUs they ran on, the lane that judged it, and, on a
    shared GPU, its turns on the device."""
    verdict = record.verdict or {}
    sizes = verdict.get("problem_bytes") or {}
    baselines = verdict.get("baselines") or {}
    environment = verdict.get("environment") or {}
    return {"task": record.task_key, "status": record.status, "error": record.error,
            "input_gb": _gb(sizes.get("input_bytes")), "output_gb": _gb(sizes.get("output_bytes")),
            "memory_mb": verdict.get("memory_mb") or {},
            "baseline_ms": {name: stats["median_ms"] for name, stats in baselines.items()},
            "baseline_sources": verdict.get("baseline_sources") or {},
            "baseline_exhausted": sorted(name for name, stats in baselines.items() if stats.get("budget_exhausted")),
            "timing_loops": {name: _loop_precision(stats) for name, stats in
                             {**baselines, "candidate": verdict.get("candidate_timing")}.items() if stats},
            "baseline_seconds": verdict.get("baseline_seconds") or {},
            "phase_seconds": verdict.get("phase_seconds") or {}, "device_seconds": verdict.get("device_seconds") or {},
            "device_turns": verdict.get("device_turns") or [],
            "prestarted": environment.get("prestarted"), "timed_cpus": environment.get("timed_cpus"),
            "worker": record.worker, "finished_at": record.finished_at}


def _loop_precision(stats: dict[str, Any]) -> dict[str, Any]:
    """How far a timing loop got: why a loop that ran out of budget did (too few samples, or noisy ones)."""
    return {key: stats.get(key) for key in ("n", "calls_per_sample", "rel_std_err", "median_rel_err")}


def _gb(nbytes: Optional[int]) -> Optional[float]:
    return None if nbytes is None else nbytes / 1e9


def selfcheck_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = WrappingTable(title=title)
    for column in ("task", "status", "in GB", "out GB", "ref host/dev GB", "cand host/dev GB",
                   "eager ms off/on", "compile ms off/on", "verdict s"):
        table.add_column(column, justify="left" if column in ("task", "status") else "right")

    def pair(a: Optional[float], b: Optional[float], scale: float = 1.0) -> str:
        return "/".join("—" if v is None else f"{v * scale:.3g}" for v in (a, b))

    for row in rows:
        memory, ms = row["memory_mb"], row["baseline_ms"]
        workers = [pair(memory.get(w, {}).get("peak_host_mb"), memory.get(w, {}).get("peak_device_mb"), 2**20 / 1e9)
                   for w in ("reference", "candidate")]
        total = row["phase_seconds"].get("total")
        table.add_row(row["task"], row["status"], pair(row["input_gb"], None).split("/")[0],
                      pair(row["output_gb"], None).split("/")[0], *workers,
                      pair(ms.get("eager_tf32_off"), ms.get("eager_tf32_on")),
                      pair(ms.get("compile_tf32_off"), ms.get("compile_tf32_on")),
                      "—" if total is None else f"{total:.3g}")
    return table


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

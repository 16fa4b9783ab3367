"""Full evaluations per GPU-hour: cuda-agent's pipeline vs the common public harness, same run.

N distinct candidates (variants of the bundled single-file samples, or with ``--contract launcher``
of the fast-contract agent workdirs; every translation unit differs, so no cache can serve a build)
go through the whole pipeline: build, verify (7 trials, audits, runtime guards, sandbox) and
profile. cuda-agent: builds run on all CPU cores ahead of the GPU (``build.max_jobs`` per build,
several builds at once) while one GPU worker evaluates one candidate at a time from prestarted
worker slots. The baseline does what the KernelBench harness does, in one fresh process, one
candidate after another: ``load_inline`` in the evaluating process, 5 correctness trials, 100
timed trials of candidate and reference
(``bench/baseline_harness.py``); it cannot build workdirs, so it always evaluates variants of the
single-file samples of the same tasks, in the same order. The precompiled header, the launcher shim
(``--contract launcher``) and the per-task baselines (eager and ``torch.compile``, cached in SQLite
in normal use) are prepared before the clock starts; their cost is reported separately. Prints one
summary line and writes JSON.

    python bench/throughput.py --device cuda --candidates 30 --baseline-candidates 6 --time-budget-s 540 \\
        --out bench/results/throughput_cuda.json
    python bench/throughput.py --device cuda --contract launcher --tasks relu --candidates 30 \\
        --baseline-candidates 6 --time-budget-s 540 --out bench/results/throughput_launcher_cuda.json
    python bench/throughput.py --device cpu --candidates 1 --baseline-candidates 1 --out /tmp/t.json   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

from benchlib import (
    EXAMPLES, REPO, SMOKE_TIMING, Budget, device_label, machine_details, make_variant, median_phases, sample_solution,
    write_json,
)

from cuda_agent.environment import EvalConfig, Verdict, evaluate, load_task
from cuda_agent.environment.build import CompileError, build_solution, toolchain_dir
from cuda_agent.environment.build_sandbox import prepare_toolchain
from cuda_agent.environment.compiler import ExtensionCompiler, torch_toolchain
from cuda_agent.environment.slots import Prestarter
from cuda_agent.environment.solution import load_solution
from cuda_agent.environment.slots import default_prestart_slots

TASKS = ("relu", "softmax", "rmsnorm", "row_sum", "add_relu_mul", "matmul")
CONTRACTS = ("single", "launcher")
BASELINE_CONTRACT = "single"
"""The KernelBench-style harness builds with ``load_inline`` in its own process: single files only."""


@dataclass(frozen=True)
class Job:
    task_path: Path
    solution: Path


def make_jobs(device: str, tasks: list[str], contract: str, count: int, workspace: Path) -> list[Job]:
    """``count`` distinct variants of the ``contract`` samples of ``tasks``, cycling through them in
    order: the same ``tasks`` give both harnesses the same task sequence whatever the contract."""
    return [Job(EXAMPLES / "tasks" / f"{tasks[i % len(tasks)]}.py",
                make_variant(sample_solution(device, tasks[i % len(tasks)], contract), i, workspace))
            for i in range(count)]


def evaluate_jobs(jobs: list[Job], config: EvalConfig, build_parallel: int, budget: Budget) -> list[tuple[Job, Verdict]]:
    """Evaluate ``jobs`` on this host's GPU, building ahead on the CPU cores.

    The one place to switch to the shared worker pool (``cuda_agent.pool`` / ``cuda_agent.scale``
    on the ``evaluate`` branch) once merged: it takes the same (task, solution) jobs and config
    and returns (job, verdict) pairs. Here: ``build_parallel`` builds at a time in threads (each a
    compile child), and one evaluation at a time (exclusive GPU) from prestarted worker slots, in
    the order the builds finish. Stops starting evaluations when ``budget`` is spent.
    """
    results = []
    with ThreadPoolExecutor(max_workers=build_parallel) as builders, Prestarter(config, count=default_prestart_slots(config.device)) as prestarted:
        builds = {builders.submit(_build_quietly, job, config): job for job in jobs}
        for build in as_completed(builds):
            if budget.spent():
                break
            job = builds[build]  # built: the evaluation below hits the build cache
            results.append((job, evaluate(load_task(job.task_path), job.solution, config, prestarted=prestarted)))
        for build in builds:
            build.cancel()
    return results


def _build_quietly(job: Job, config: EvalConfig) -> None:
    try:
        build_solution(load_solution(job.solution), config.device, config.build, config.cache_dir)
    except CompileError:
        pass  # the evaluation reports it


class GpuUtilization:
    """Mean ``utilization.gpu`` (the share of time a kernel was running) sampled by nvidia-smi."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GpuUtilization":
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200", "-i", "0"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()) / 100)
            except ValueError:
                continue

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def _prepare(jobs: list[Job], config: EvalConfig, contract: str) -> dict[str, float | None]:
    """What normal use has cached already: the precompiled header, the launcher shim (once per
    toolchain; only the fast contract links it), and each task's baselines (one evaluation of the
    bundled single-file sample per task, which also warms its build)."""
    started = time.monotonic()
    ExtensionCompiler(torch_toolchain(config.device == "cuda"), config.cache_dir, 1,
                      tuple(config.build.extra_cflags)).precompiled_header_dir()
    pch_s = time.monotonic() - started
    started, shim_s = time.monotonic(), None
    if contract == "launcher":
        tools = toolchain_dir(config.device, config.build, config.cache_dir)
        prepare_toolchain(config.device, config.build, config.cache_dir, tools, precompiled_header=False, shim=True)
        shim_s = time.monotonic() - started
    started = time.monotonic()
    for task_path in sorted({job.task_path for job in jobs}):
        evaluate(load_task(task_path), sample_solution(config.device, task_path.stem, "single"), config)
    return {"pch_s": pch_s, "shim_s": shim_s, "task_baselines_s": time.monotonic() - started}


def _run_ours(jobs: list[Job], config: EvalConfig, build_parallel: int, budget: Budget) -> dict:
    started = time.monotonic()
    with GpuUtilization() as gpu:
        results = evaluate_jobs(jobs, config, build_parallel, budget)
    wall_s = time.monotonic() - started
    verdicts = [v for _, v in results]
    return {"wall_s": wall_s, "evaluations": len(verdicts), "evals_per_hour": len(verdicts) / wall_s * 3600,
            "gpu_busy_fraction": gpu.mean, "correct": sum(v.correct for v in verdicts),
            "build_s": [v.build.seconds if v.build else None for v in verdicts],
            "phase_seconds": [v.phase_seconds for v in verdicts],
            "statuses": [v.status.value for v in verdicts]}


def _accounting(ours: dict) -> dict[str, float]:
    """Where every second of the timed run went, summed over its evaluations (each evaluation's
    phases add up to its total); ``waiting_for_builds_s`` is the rest of the wall time, when the
    GPU worker had no built candidate to evaluate."""
    phases = ours["phase_seconds"]
    seconds = {f"{k}_s": sum(p.get(k, 0.0) for p in phases) for k in sorted({k for p in phases for k in p} - {"total"})}
    evaluating = sum(p.get("total", 0.0) for p in phases)
    return {"wall_s": ours["wall_s"], "evaluating_s": evaluating, **seconds,
            "waiting_for_builds_s": max(0.0, ours["wall_s"] - evaluating)}


def _run_baseline(jobs: list[Job], device: str, budget_s: float) -> dict:
    """The KernelBench-style harness in one fresh process, candidates one after another."""
    script = (
        "import json, sys, time; sys.path.insert(0, sys.argv[1]); import baseline_harness as h; "
        "from pathlib import Path; jobs = json.loads(sys.argv[2]); deadline = time.monotonic() + float(sys.argv[4]); out = []\n"
        "for task, solution in jobs:\n"
        "    if time.monotonic() > deadline: break\n"
        "    out.append(h.evaluate_in_process(Path(task), Path(solution), sys.argv[3])); print(json.dumps(out[-1]), file=sys.stderr, flush=True)\n"
        "print(json.dumps(out))"
    )
    payload = json.dumps([[str(j.task_path), str(j.solution)] for j in jobs])
    env = {**os.environ, "MAX_JOBS": str(os.cpu_count() or 1)}
    started = time.monotonic()
    with GpuUtilization() as gpu:
        result = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), payload, device, str(budget_s)],
                                capture_output=True, text=True, env=env)
    wall_s = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"baseline harness failed:\n{result.stderr[-4000:]}")
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    return {"wall_s": wall_s, "evaluations": len(rows), "evals_per_hour": len(rows) / wall_s * 3600,
            "gpu_busy_fraction": gpu.mean, "correct": sum(r["correct"] for r in rows), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--candidates", type=int, default=30, help="distinct candidates through cuda-agent")
    parser.add_argument("--baseline-candidates", type=int, default=6,
                        help="through the baseline: the first candidates (--contract launcher: their tasks' single files)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS),
                        help="bundled sample tasks (those without a sample in --contract are skipped)")
    parser.add_argument("--contract", choices=CONTRACTS, default="single",
                        help="cuda-agent's candidates: single files, or fast-contract agent workdirs "
                             "(examples/solutions/<device>_workdir/<task>); the baseline always gets single files")
    parser.add_argument("--build-parallel", type=int, default=0, help="builds at once (default: cores / 3, >= 1)")
    parser.add_argument("--time-budget-s", type=float, default=540.0,
                        help="whole run; the baseline gets up to 40%% of what is left after preparing")
    parser.add_argument("--cache-dir", type=Path, default=None, help="build/baseline cache (default: a fresh one)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--smoke", action="store_true",
                        help="CI smoke mode: tiny timing budgets and no torch.compile baseline (numbers meaningless)")
    args = parser.parse_args()

    tasks = [t for t in args.tasks
             if all(sample_solution(args.device, t, c).exists() for c in {args.contract, BASELINE_CONTRACT})]
    if not tasks:
        pattern = sample_solution(args.device, "<task>", args.contract).relative_to(REPO)
        raise SystemExit(f"none of the tasks {' '.join(args.tasks)} has a {args.contract}-contract sample "
                         f"for {args.device} ({pattern})")
    budget = Budget(args.time_budget_s)
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-bench-throughput-"))
    config = EvalConfig(device=args.device, cache_dir=args.cache_dir or workspace / "cache")
    config = replace(config, build=replace(config.build, max_jobs=min(4, os.cpu_count() or 1)),
                     timing=SMOKE_TIMING if args.smoke else config.timing)
    build_parallel = args.build_parallel or max(1, (os.cpu_count() or 1) // 3)  # ~3 busy cores per build
    try:
        jobs = make_jobs(args.device, tasks, args.contract, args.candidates, workspace)
        baseline_jobs = (jobs[: args.baseline_candidates] if args.contract == BASELINE_CONTRACT else
                         make_jobs(args.device, tasks, BASELINE_CONTRACT, args.baseline_candidates, workspace))
        prepared = _prepare(jobs, config, args.contract)
        baseline = _run_baseline(baseline_jobs, args.device, 0.4 * budget.left_s())
        ours = _run_ours(jobs, config, build_parallel, budget)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    details = machine_details()
    result = {
        "device": device_label(details), "machine": details, "backend": args.device,
        "contract": args.contract, "baseline_contract": BASELINE_CONTRACT, "tasks": tasks,
        "evals_per_gpu_hour": ours["evals_per_hour"], "baseline_evals_per_gpu_hour": baseline["evals_per_hour"],
        "throughput_ratio": ours["evals_per_hour"] / baseline["evals_per_hour"],
        "gpu_busy_fraction": ours["gpu_busy_fraction"], "baseline_gpu_busy_fraction": baseline["gpu_busy_fraction"],
        "median_eval_phase_seconds": median_phases(ours["phase_seconds"]),
        "where_the_seconds_went": _accounting(ours),
        "prepared_before_clock": prepared, "build_parallel": build_parallel, "build_max_jobs": config.build.max_jobs,
        "cuda_agent": ours, "baseline": baseline,
    }
    print(f"throughput ({args.device}, contract {args.contract}, baseline {BASELINE_CONTRACT}): "
          f"cuda-agent {ours['evals_per_hour']:.0f} evaluations/GPU-hour "
          f"({ours['evaluations']} in {ours['wall_s']:.0f} s, {ours['correct']} correct) vs KernelBench-style "
          f"{baseline['evals_per_hour']:.0f} ({baseline['evaluations']} in {baseline['wall_s']:.0f} s): "
          f"{result['throughput_ratio']:.2f}x")
    write_json(result, args.out)


if __name__ == "__main__":
    main()

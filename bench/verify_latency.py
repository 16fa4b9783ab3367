"""Latency of one verdict: uncached, cached, warm (prestarted), and ``cuda-agent verify`` as typed.

Runs one sample task/solution pair through the whole pipeline: N times with a fresh build (the
solution is copied with a unique trailing comment, so the build cache cannot help), N times with
the build cached, N times with the build cached and the workers prestarted, each after
``--think-s`` seconds in which the slots warm up (what an agent's repeated ``./verify`` calls see,
its policy generating between them: ``warm_eval_median_s``), and a few times as a user types it
(``cuda-agent verify TASK SOLUTION --json`` in a fresh process, build cached:
``cli_verify_cached_s``; and with ``--keep-warm``, ``--think-s`` apart, after a first call that
starts the keep-warm evaluator: ``cli_verify_keep_warm_s``). Reports the medians, the coefficient
of variation of ``candidate_ms`` over the cached runs, and where the time goes: the median
``phase_seconds`` of the cached, warm and CLI runs (``*_median_phase_seconds``; the CLI's from its
``--json`` verdict). Prints a one-line summary and writes JSON.

    python bench/verify_latency.py --device cuda --task relu --runs 10 --out bench/results/verify_latency_cuda.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import cli_keep_warm, cli_verify, device_label, machine_details, median_phases

from cuda_agent.cli import examples_dir
from cuda_agent.cli_support import default_device
from cuda_agent.environment import EvalConfig, Prestarter, TimingConfig, evaluate, load_task
from cuda_agent.environment.slots import default_prestart_slots


def _variant(solution: Path, index: int, workspace: Path) -> Path:
    """A copy of ``solution`` whose sources differ (so its build key differs) but behave the same."""
    if solution.is_file():
        target = workspace / f"{solution.stem}_{index}.py"
        target.write_text(solution.read_text() + f"\n# benchmark variant {index}\n")
        return target
    target = workspace / f"{solution.name}_{index}"
    shutil.copytree(solution, target)
    kernel = sorted(p for p in (target / "kernels").iterdir() if p.suffix in (".cu", ".cpp"))[0]
    kernel.write_text(kernel.read_text() + f"\n// benchmark variant {index}\n")
    return target


def _timed(task, solution: Path, config: EvalConfig, prestarted: Prestarter | None = None) -> tuple[float, object]:
    started = time.perf_counter()
    verdict = evaluate(task, solution, config, prestarted=prestarted)
    elapsed = time.perf_counter() - started
    if not verdict.correct:
        raise SystemExit(f"benchmark candidate failed: {verdict.status.value}: {verdict.error}")
    return elapsed, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--task", default="relu", help="sample task name under examples/tasks")
    parser.add_argument("--layout", default="single", choices=["single", "workdir"])
    parser.add_argument("--runs", type=int, default=10, help="cached runs (CV is taken over these)")
    parser.add_argument("--uncached-runs", type=int, default=3)
    parser.add_argument("--cli-runs", type=int, default=3, help="`cuda-agent verify` runs (build cached)")
    parser.add_argument("--think-s", type=float, default=8.0,
                        help="pause before each warm run (an agent's generation time between evaluations)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="build/baseline cache to use (default: a fresh temporary one)")
    args = parser.parse_args()

    device = args.device or default_device()
    root = examples_dir()
    task = load_task(root / "tasks" / f"{args.task}.py")
    solution = (root / "solutions" / device / f"{args.task}.py" if args.layout == "single"
                else root / "solutions" / f"{device}_workdir" / args.task)
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-bench-"))
    config = EvalConfig(device=device, cache_dir=args.cache_dir or workspace / "cache", timing=TimingConfig())
    try:
        _timed(task, solution, config)  # warm the baseline cache, so every measured run sees the same work
        uncached = [_timed(task, _variant(solution, i, workspace), config)[0] for i in range(args.uncached_runs)]
        cached_runs = [_timed(task, solution, config) for _ in range(args.runs)]
        with Prestarter(config, count=default_prestart_slots(config.device)) as prestarted:
            warm_runs = []
            for _ in range(args.runs):
                time.sleep(args.think_s)
                warm_runs.append(_timed(task, solution, config, prestarted))
        task_file = root / "tasks" / f"{args.task}.py"
        env = {"CUDA_AGENT_CACHE_DIR": str(config.cache_dir), "CUDA_AGENT_WARM_DIR": str(workspace / "warm")}
        (workspace / "warm").mkdir(mode=0o700)
        cli_runs = [cli_verify(task_file, solution, device, env) for _ in range(args.cli_runs)]
        keep_warm_runs = cli_keep_warm(task_file, solution, device, env, args.cli_runs, args.think_s)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    cached = [t for t, _ in cached_runs]
    cli_cached = [t for t, _ in cli_runs]
    keep_warm = [t for t, _ in keep_warm_runs]
    candidate_ms = [v.candidate_ms for _, v in cached_runs]
    cv = statistics.stdev(candidate_ms) / statistics.fmean(candidate_ms)
    environment = cached_runs[0][1].environment
    details = machine_details()
    result = {
        "device": device_label(details), "machine": details,
        "environment": environment,
        "host": {"machine": platform.machine(), "python": sys.version.split()[0]},
        "task": args.task, "layout": args.layout, "solution": str(solution),
        "verify_uncached_median_s": statistics.median(uncached), "verify_uncached_s": uncached,
        "verify_cached_median_s": statistics.median(cached), "verify_cached_s": cached,
        "verify_cached_median_phase_seconds": median_phases([v.phase_seconds for _, v in cached_runs]),
        "candidate_ms": candidate_ms, "candidate_ms_cv": cv,
        "warm_eval_median_s": statistics.median(t for t, _ in warm_runs), "warm_eval_s": [t for t, _ in warm_runs],
        "warm_eval_median_phase_seconds": median_phases([v.phase_seconds for _, v in warm_runs]),
        "cli_verify_cached_s": statistics.median(cli_cached), "cli_verify_cached_runs_s": cli_cached,
        "cli_verify_cached_median_phase_seconds": median_phases([v["phase_seconds"] for _, v in cli_runs]),
        "cli_verify_keep_warm_first_s": keep_warm[0],
        "cli_verify_keep_warm_s": statistics.median(keep_warm[1:]), "cli_verify_keep_warm_runs_s": keep_warm,
        "cli_verify_keep_warm_median_phase_seconds": median_phases(
            [v["phase_seconds"] for _, v in keep_warm_runs[1:]]),  # the first starts the evaluator
    }
    print(f"{args.task} ({args.layout}, {device}): verify uncached median {result['verify_uncached_median_s']:.1f} s, "
          f"cached median {result['verify_cached_median_s']:.1f} s, warm median {result['warm_eval_median_s']:.2f} s, "
          f"`cuda-agent verify` cached {result['cli_verify_cached_s']:.1f} s, with --keep-warm "
          f"{result['cli_verify_keep_warm_s']:.1f} s; candidate_ms CV over {args.runs} runs {cv:.2%}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

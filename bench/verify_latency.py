"""Wall time of one full ``verify`` (build uncached and cached) and repeatability of ``candidate_ms``.

Runs one sample task/solution pair through the whole pipeline: N times with a fresh build (the
solution is copied with a unique trailing comment, so the build cache cannot help), N times with
the build cached, and reports the median wall time of each and the coefficient of variation of
``candidate_ms`` over the cached runs. Prints a one-line summary and writes JSON.

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

from cuda_agent.cli import default_device, examples_dir
from cuda_agent.environment import EvalConfig, TimingConfig, evaluate, load_task


def _variant(solution: Path, index: int, workspace: Path) -> Path:
    """A copy of ``solution`` whose sources differ (so its build key differs) but behave the same."""
    if solution.is_file():
        target = workspace / f"{solution.stem}_{index}.py"
        target.write_text(solution.read_text() + f"\n# benchmark variant {index}\n")
        return target
    target = workspace / f"{solution.name}_{index}"
    shutil.copytree(solution, target)
    binding = next(target.glob("kernels/*_binding.cpp"))
    binding.write_text(binding.read_text() + f"\n// benchmark variant {index}\n")
    return target


def _timed(task, solution: Path, config: EvalConfig) -> tuple[float, object]:
    started = time.perf_counter()
    verdict = evaluate(task, solution, config)
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
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    cached = [t for t, _ in cached_runs]
    candidate_ms = [v.candidate_ms for _, v in cached_runs]
    cv = statistics.stdev(candidate_ms) / statistics.fmean(candidate_ms)
    environment = cached_runs[0][1].environment
    result = {
        "device": environment.get("gpu") or environment.get("cpu"),
        "environment": environment,
        "host": {"machine": platform.machine(), "python": sys.version.split()[0]},
        "task": args.task, "layout": args.layout, "solution": str(solution),
        "verify_uncached_median_s": statistics.median(uncached), "verify_uncached_s": uncached,
        "verify_cached_median_s": statistics.median(cached), "verify_cached_s": cached,
        "candidate_ms": candidate_ms, "candidate_ms_cv": cv,
    }
    print(f"{args.task} ({args.layout}, {device}): verify uncached median {result['verify_uncached_median_s']:.1f} s, "
          f"cached median {result['verify_cached_median_s']:.1f} s; candidate_ms CV over {args.runs} runs {cv:.2%}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Repeatability of the reported candidate time, and agreement with an independent measurement.

For kernels of about 10 µs, 100 µs, 1 ms and 10 ms (the bundled ReLU and matmul samples at sizes
that take about that long on an H100), runs the full evaluation (``evaluate``: build cached,
correctness trials, timing, audits) ``--repeats`` times and reports the coefficient of variation
of ``candidate_ms`` over those evaluations. Each size's kernel is also timed independently, in
this process, by the torch profiler (the sum of the device durations of the kernels one call
launches, averaged over 20 calls, no L2 flush): ``agreement`` = reported / profiler. Every size is
built and its baselines timed first (one untimed evaluation each, no ``torch.compile`` baseline:
the candidate's time is what is measured); the repeats share what is left of the budget. On CPU
the smoke mode times one tiny ReLU a few times. Prints one summary line and writes JSON (after
every size; ``timed_cpus``: what the verdicts say the timing loops ran on).
``CUDA_AGENT_TIMED_CPU=off`` measures without a CPU set apart for timing.

    python bench/timing.py --device cuda --repeats 20 --time-budget-s 540 --out bench/results/timing_cuda.json
    python bench/timing.py --device cpu --repeats 3 --out /tmp/timing_cpu.json          # CPU smoke
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from benchlib import EXAMPLES, SMOKE_TIMING, Budget, device_label, machine_details, sample_solution, write_json

from cuda_agent.environment import EvalConfig, evaluate, load_task
from cuda_agent.environment.build import build_solution
from cuda_agent.environment.slots import Prestarter
from cuda_agent.environment.solution import load_solution

SIZES = {
    # label: (sample task, module constants)
    "cuda": {
        "10us": ("relu", {"batch_size": 1024, "dim": 4096}),  # 32 MB of traffic
        "100us": ("relu", {"batch_size": 10240, "dim": 4096}),  # 320 MB
        "1ms": ("matmul", {"N": 1536}),  # 7 GFLOP
        "10ms": ("matmul", {"N": 3584}),  # 92 GFLOP
    },
    "cpu": {"smoke": ("relu", {"batch_size": 16, "dim": 256})},
}


def sized_task(task: str, constants: dict[str, int], workspace: Path) -> Path:
    """A copy of a bundled task with its size constants replaced."""
    text = (EXAMPLES / "tasks" / f"{task}.py").read_text()
    for name, value in constants.items():
        text, count = re.subn(rf"^{name} = \d+$", f"{name} = {value}", text, flags=re.MULTILINE)
        if count != 1:
            raise SystemExit(f"examples/tasks/{task}.py has no constant {name!r} to resize")
    path = workspace / f"{task}_{'_'.join(map(str, constants.values()))}.py"
    path.write_text(text)
    return path


_TORCH_LOADERS: dict[str, object] = {}
"""torch's own ``load_inline``/``load``, kept before the first patch (patching twice would wrap a wrapper)."""
_SOLUTIONS: dict[Path, object] = {}
"""Solution modules imported here, once each: a second import would build the extension again."""


def profiler_ms(task_path: Path, solution: Path, extensions_dir: Path, calls: int = 20) -> float | None:
    """Device time of one call's kernels by the torch profiler (CUDA only), loading the extension
    the build made the way the candidate worker does."""
    import torch
    import torch.utils.cpp_extension as cpp_extension

    from cuda_agent.environment.loading import import_file
    from cuda_agent.environment.prebuilt import prebuilt_loader

    if not torch.cuda.is_available():
        return None
    if solution not in _SOLUTIONS:
        for name in ("load_inline", "load"):
            original = _TORCH_LOADERS.setdefault(name, getattr(cpp_extension, name))
            setattr(cpp_extension, name, prebuilt_loader(name, original, lambda: extensions_dir))
        _SOLUTIONS[solution] = import_file(solution, f"bench_solution_{len(_SOLUTIONS)}")
    task = import_file(task_path, f"bench_task_{task_path.stem}")
    model = _SOLUTIONS[solution].ModelNew(*task.get_init_inputs()).cuda()
    inputs = [x.cuda() for x in task.get_inputs()]
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                model(*inputs)
            torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) for e in kernels)
    return total_us / calls / 1e3 if total_us > 0 else None


@dataclass(frozen=True)
class Size:
    """One kernel size, built and its baselines timed (by an untimed first evaluation)."""

    label: str
    task_path: Path
    solution: Path
    extensions_dir: Path


def prepare_size(label: str, task_path: Path, solution: Path, config: EvalConfig, prestarted: Prestarter) -> Size:
    built = build_solution(load_solution(solution), config.device, config.build, config.cache_dir)
    evaluate(load_task(task_path), solution, config, prestarted=prestarted)
    print(f"  {label:>6}: built and baselines timed", file=sys.stderr, flush=True)
    return Size(label, task_path, solution, built.extensions_dir)


def measure_size(size: Size, config: EvalConfig, prestarted: Prestarter, repeats: int, budget: Budget) -> dict:
    label, task = size.label, load_task(size.task_path)
    times, statuses, calls, timed_cpus = [], [], None, set()
    for _ in range(repeats):
        if budget.spent() and len(times) >= 3:
            break
        verdict = evaluate(task, size.solution, config, prestarted=prestarted)
        print(f"  {label:>6}: evaluation {len(times) + 1}: {verdict.status.value}, candidate_ms "
              f"{verdict.candidate_ms}", file=sys.stderr, flush=True)
        statuses.append(verdict.status.value)
        if verdict.candidate_ms is None:
            raise SystemExit(f"{label}: the sample did not pass: {verdict.status.value}: {verdict.error}")
        times.append(verdict.candidate_ms)
        calls = verdict.candidate_timing.calls_per_sample if verdict.candidate_timing else None
        timed_cpus.add(str(verdict.environment.get("timed_cpus")))
    independent = profiler_ms(size.task_path, size.solution, size.extensions_dir) if config.device == "cuda" else None
    median = statistics.median(times)
    cv = statistics.stdev(times) / statistics.fmean(times) if len(times) > 1 else None
    print(f"  {label:>6}: median {median:.5f} ms over {len(times)} evaluations, CV {cv if cv is None else f'{cv:.2%}'}, "
          f"{calls} calls per sample, profiler {independent}", file=sys.stderr, flush=True)
    return {"task": size.task_path.name, "candidate_ms": times, "median_ms": median, "cv": cv,
            "calls_per_sample": calls, "profiler_ms": independent,
            "agreement": median / independent if independent else None, "statuses": statuses,
            "timed_cpus": sorted(timed_cpus)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--repeats", type=int, default=20, help="evaluations per kernel size")
    parser.add_argument("--sizes", nargs="+", default=None, help="labels to run (default: all for the device)")
    parser.add_argument("--time-budget-s", type=float, default=540.0,
                        help="whole run; what the builds and baselines leave is shared by the sizes, and a size "
                             "stops repeating (after 3) when its share is spent")
    parser.add_argument("--cache-dir", type=Path, default=None, help="build/baseline cache (default: a fresh one)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--smoke", action="store_true",
                        help="CI smoke mode: tiny timing budgets and no torch.compile baseline (numbers meaningless)")
    args = parser.parse_args()

    sizes = {k: v for k, v in SIZES[args.device].items() if args.sizes is None or k in args.sizes}
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-bench-timing-"))
    config = EvalConfig(device=args.device, cache_dir=args.cache_dir or workspace / "cache")
    # The candidate's time is what is measured; baselines are timed once per size and then cached,
    # so torch.compile's baseline would only lengthen the preparation.
    config = config.replace(timing=replace(config.timing, compile_baseline=False))
    if args.smoke:
        config = config.replace(timing=SMOKE_TIMING)  # has no compiled baseline either
    results: dict[str, dict] = {}
    details = machine_details()
    try:
        budget = Budget(args.time_budget_s)
        with Prestarter(config) as prestarted:
            # Builds and baselines first, so a cold cache does not eat the first size's share of repeats.
            prepared = [prepare_size(label, sized_task(task, constants, workspace),
                                     sample_solution(args.device, task, "single"), config, prestarted)
                        for label, (task, constants) in sizes.items()]
            for done, size in enumerate(prepared):
                share = Budget(budget.left_s() / (len(prepared) - done))  # what is left, shared by the sizes left
                results[size.label] = measure_size(size, config, prestarted, args.repeats, share)
                result = timing_result(args.device, details, results)
                write_json(result, args.out)  # after every size: a run stopped by its caller keeps the sizes done
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    print(f"timing ({args.device}): CV of candidate_ms over repeated evaluations "
          + ", ".join(f"{k} {v:.2%}" if v is not None else f"{k} n/a" for k, v in result["timing_cv"].items()))


def timing_result(backend: str, details: dict, results: dict[str, dict]) -> dict:
    return {"device": device_label(details), "machine": details, "backend": backend,
            "timing_cv": {label: r["cv"] for label, r in results.items()},
            "timing_agreement": {label: r["agreement"] for label, r in results.items()},
            "sizes": results}


if __name__ == "__main__":
    main()

"""Cold compile time per candidate: cuda-agent's lean build path vs plain ``load_inline``.

Every candidate is a variant of a bundled sample whose translation units all differ from every
other variant's (so no build or object cache can serve it). Each is built twice, alternately:
by cuda-agent's protected build (``build_solution``: compile child, precompiled
``torch/extension.h``, object cache, parallel units, one GPU architecture) and the KernelBench way
(importing the module in a fresh interpreter that has already imported torch: ``load_inline`` with
``torch/extension.h`` through ninja, ``MAX_JOBS`` = all cores). The precompiled header is built once
before the clock starts (once per toolchain, reused by every later candidate); its own build time
is reported separately. Prints one summary line and writes JSON.

    python bench/compile.py --device cuda --variants 6 --time-budget-s 500 --out bench/results/compile_cuda.json
    python bench/compile.py --device cpu --variants 1 --tasks relu --out /tmp/compile_cpu.json   # CPU smoke
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Budget, device_label, machine_details, make_variant, median, sample_solution, write_json

from cuda_agent.environment import BuildConfig
from cuda_agent.environment.build import CompileError, build_solution
from cuda_agent.environment.build_sandbox import prepare_precompiled_headers
from cuda_agent.environment.solution import load_solution

DEFAULT_TASKS = ("relu", "softmax", "rmsnorm", "matmul")


def _ours(solution: Path, device: str, config: BuildConfig, cache_dir: Path) -> dict:
    built = build_solution(load_solution(solution), device, config, cache_dir)
    return {"seconds": built.info.seconds, **built.info.compile_stats}


def _baseline(solution: Path, workdir: bool) -> float:
    command = [sys.executable, str(Path(__file__).with_name("baseline_harness.py")), "compile", str(solution)]
    env = {**os.environ, "MAX_JOBS": str(os.cpu_count() or 1)}
    result = subprocess.run(command + (["--workdir"] if workdir else []), capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"baseline compile of {solution} failed:\n{result.stderr[-3000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def _prebuild_pch(device: str, config: BuildConfig, cache_dir: Path) -> float:
    """Build the precompiled headers the candidates will use, the way evaluations do; returns seconds."""
    started = time.monotonic()
    prepare_precompiled_headers(device, config, cache_dir)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="bundled sample tasks to vary")
    parser.add_argument("--layouts", nargs="+", choices=["single", "workdir"], default=["single", "workdir"])
    parser.add_argument("--variants", type=int, default=2, help="variants per (task, layout)")
    parser.add_argument("--time-budget-s", type=float, default=540.0, help="no new build starts after this")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache holding the precompiled header (default: a fresh temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args()

    budget = Budget(args.time_budget_s)
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-bench-compile-"))
    cache_dir = args.cache_dir or workspace / "cache"
    config = BuildConfig()
    rows = []
    try:
        pch_s = _prebuild_pch(args.device, config, cache_dir)
        pairs = [(t, layout) for layout in args.layouts for t in args.tasks
                 if sample_solution(args.device, t, layout).exists()]
        for index in range(args.variants):
            for task, layout in pairs:
                if budget.spent():
                    break
                variant = make_variant(sample_solution(args.device, task, layout), len(rows), workspace)
                ours = _ours(variant, args.device, config, cache_dir)
                baseline_s = _baseline(variant, layout == "workdir")
                rows.append({"task": task, "layout": layout, "ours_s": ours.pop("seconds"), "baseline_s": baseline_s,
                             **ours})
                print(f"  {task:<10} {layout:<8} ours {rows[-1]['ours_s']:6.1f} s   load_inline {baseline_s:6.1f} s",
                      file=sys.stderr, flush=True)
    except CompileError as exc:
        raise SystemExit(f"benchmark candidate failed to build: {exc}\n{exc.log_tail}") from None
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    details = machine_details()
    ours_median, baseline_median = median([r["ours_s"] for r in rows]), median([r["baseline_s"] for r in rows])
    result = {
        "device": device_label(details), "machine": details, "backend": args.device,
        "compile_median_s": ours_median, "baseline_compile_median_s": baseline_median,
        "compile_speedup": baseline_median / ours_median if rows else None,
        "pch_build_s": pch_s, "candidates": len(rows), "rows": rows,
        "build_config": {"cuda_arch": config.cuda_arch, "extra_cflags": config.extra_cflags,
                         "extra_cuda_cflags": config.extra_cuda_cflags, "jobs": config.max_jobs or os.cpu_count()},
    }
    if not rows:
        raise SystemExit("no candidate was built within the time budget")
    print(f"compile ({args.device}, {len(rows)} candidates): cuda-agent median {ours_median:.1f} s vs load_inline "
          f"{baseline_median:.1f} s ({result['compile_speedup']:.2f}x); precompiled header once {pch_s:.1f} s")
    write_json(result, args.out)


if __name__ == "__main__":
    main()

"""Cold compile time per candidate and per binding contract: cuda-agent's build vs plain ``load_inline``.

Every candidate is a variant of a bundled sample whose translation units all differ from every
other variant's (so no build or object cache can serve it). Contracts (``--contracts``), side by side
in one run: ``single`` (a file whose ``load_inline`` compiles torch glue and kernels), ``binding``
(a workdir whose ``kernels/*_binding.cpp`` hold torch glue) and ``launcher`` (the fast contract:
kernels export launchers, the harness's pre-built shim is the glue, no unit includes a torch
header). Each is built by cuda-agent's protected build (``build_solution``: compile child,
precompiled ``torch/extension.h``, object cache, parallel units, one GPU architecture) and, for the
contracts torch's builder can build, the KernelBench way too (importing the module in a fresh
interpreter that has already imported torch: ``load_inline``/``load`` with ``torch/extension.h``
through ninja, ``MAX_JOBS`` = all cores). What builds once per toolchain (the precompiled header,
torch's flags, the launcher shim) is prepared before the clock starts, reused by every later
candidate, and reported separately (``pch_build_s``). Prints one summary line and writes JSON.

    python bench/compile.py --device cuda --variants 2 --time-budget-s 500 --out bench/results/compile_cuda.json
    python bench/compile.py --device cpu --variants 1 --tasks relu --out bench/results/compile_cpu.json
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

from benchlib import CONTRACTS, Budget, device_label, machine_details, make_variant, median, sample_solution, write_json

from cuda_agent.environment import BuildConfig
from cuda_agent.environment.build import CompileError, build_solution, toolchain_dir
from cuda_agent.environment.build_sandbox import prepare_toolchain
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


def _prepare(device: str, config: BuildConfig, cache_dir: Path) -> float:
    """Prepare what builds once per toolchain, the way evaluations do; returns seconds."""
    started = time.monotonic()
    prepare_toolchain(device, config, cache_dir, toolchain_dir(device, config, cache_dir), precompiled_header=True,
                      shim=True)
    return time.monotonic() - started


def _summary(rows: list[dict]) -> dict:
    with_baseline = [r for r in rows if r["baseline_s"] is not None]
    ours, baseline = median([r["ours_s"] for r in with_baseline]), median([r["baseline_s"] for r in with_baseline])
    return {"compile_median_s": median([r["ours_s"] for r in rows]), "baseline_compile_median_s": baseline,
            "compile_speedup": baseline / ours if with_baseline else None, "candidates": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="bundled sample tasks to vary")
    parser.add_argument("--contracts", nargs="+", choices=CONTRACTS, default=list(CONTRACTS),
                        help="binding contracts to build (tasks without a sample in a contract are skipped)")
    parser.add_argument("--variants", type=int, default=2, help="variants per (task, contract)")
    parser.add_argument("--no-baseline", action="store_true", help="skip torch's builder (cuda-agent's build only)")
    parser.add_argument("--time-budget-s", type=float, default=540.0, help="no new build starts after this")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache holding the precompiled header and the shim (default: a fresh temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args()

    budget = Budget(args.time_budget_s)
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-bench-compile-"))
    cache_dir = args.cache_dir or workspace / "cache"
    config = BuildConfig()
    rows = []
    try:
        prepare_s = _prepare(args.device, config, cache_dir)
        pairs = [(t, c) for c in args.contracts for t in args.tasks if sample_solution(args.device, t, c).exists()]
        for index in range(args.variants):
            for task, contract in pairs:
                if budget.spent():
                    break
                variant = make_variant(sample_solution(args.device, task, contract), len(rows), workspace)
                ours = _ours(variant, args.device, config, cache_dir)
                baseline_s = None if args.no_baseline or contract == "launcher" else _baseline(variant, contract != "single")
                rows.append({"task": task, "contract": contract, "ours_s": ours.pop("seconds"), "baseline_s": baseline_s,
                             **ours})
                print(f"  {task:<10} {contract:<8} ours {rows[-1]['ours_s']:6.1f} s   load_inline "
                      + (f"{baseline_s:6.1f} s" if baseline_s is not None else "     -"), file=sys.stderr, flush=True)
    except CompileError as exc:
        raise SystemExit(f"benchmark candidate failed to build: {exc}\n{exc.log_tail}") from None
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    if not rows:
        raise SystemExit("no candidate was built within the time budget")
    details = machine_details()
    contracts = {c: _summary([r for r in rows if r["contract"] == c]) for c in args.contracts
                 if any(r["contract"] == c for r in rows)}
    result = {
        "device": device_label(details), "machine": details, "backend": args.device, **_summary(rows),
        "contracts": contracts, "pch_build_s": prepare_s, "rows": rows,
        "build_config": {"cuda_arch": config.cuda_arch, "extra_cflags": config.extra_cflags,
                         "extra_cuda_cflags": config.extra_cuda_cflags, "jobs": config.max_jobs or os.cpu_count()},
    }
    per_contract = ", ".join(f"{c} {v['compile_median_s']:.1f} s" for c, v in contracts.items())
    versus = (f" vs load_inline {result['baseline_compile_median_s']:.1f} s ({result['compile_speedup']:.2f}x on the same "
              "candidates)" if result["compile_speedup"] else "")
    print(f"compile ({args.device}, {len(rows)} candidates): cuda-agent median {per_contract}{versus}; "
          f"once per toolchain {prepare_s:.1f} s")
    write_json(result, args.out)


if __name__ == "__main__":
    main()

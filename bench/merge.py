"""Merge the JSON results of bench/compile.py, bench/timing.py, bench/throughput.py and
bench/verify_latency.py into one.

The merged object has the headline keys at the top level (``device``, ``compile_median_s``,
``baseline_compile_median_s``, ``evals_per_gpu_hour``, ``baseline_evals_per_gpu_hour``,
``timing_cv``, ``warm_eval_median_s``, ``cli_verify_cached_s``, ...) and each input under its
kind's name (compile, timing, throughput, latency). Inputs must come from one device.

    python bench/merge.py bench/results/compile_cuda.json bench/results/timing_cuda.json \\
        bench/results/throughput_cuda.json --out bench/results/perf_cuda_h100.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HEADLINE = {
    "compile": ("compile_median_s", "baseline_compile_median_s", "compile_speedup", "pch_build_s"),
    "timing": ("timing_cv", "timing_agreement"),
    "throughput": ("evals_per_gpu_hour", "baseline_evals_per_gpu_hour", "throughput_ratio", "gpu_busy_fraction"),
    "latency": ("warm_eval_median_s", "cli_verify_cached_s", "cli_verify_keep_warm_s", "verify_cached_median_s", "verify_uncached_median_s"),
}


def _kind(result: dict) -> str:
    for kind, keys in HEADLINE.items():
        if keys[0] in result:
            return kind
    raise SystemExit(f"not a bench result (none of {[k[0] for k in HEADLINE.values()]} present)")


def merge(results: list[dict]) -> dict:
    devices = {r.get("device") for r in results}
    if len(devices) != 1:
        raise SystemExit(f"results come from different devices: {sorted(map(str, devices))}")
    merged: dict = {"device": devices.pop(), "machine": results[0].get("machine")}
    for result in results:
        kind = _kind(result)
        merged.update({k: result.get(k) for k in HEADLINE[kind]})
        merged[kind] = result
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        results = [json.loads(p.read_text()) for p in args.inputs]
    except (OSError, json.JSONDecodeError) as exc:
        print(f"cannot read a bench result: {exc}", file=sys.stderr)
        sys.exit(2)
    merged = merge(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"merged {len(results)} results for {merged['device']} into {args.out}")


if __name__ == "__main__":
    main()

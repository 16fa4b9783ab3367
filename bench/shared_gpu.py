"""Evaluations sharing a GPU: ``tasks check`` over the same tasks with 1, 2, 3 ... lanes per GPU,
side by side in one run: tasks judged per minute, the ratio to one lane, and whether the times
measured agree (each lane count's baselines against one lane's, task by task).

A self-check of synthesised tasks (inputs ~0.3 GB, eager 1-100 ms) spends most of each verdict on
the host (workers, imports, ``torch.compile``'s code generation); lanes sharing a GPU overlap that
and take turns for the device work (``environment/device_share.py``). Each lane count runs with
cache folders of its own (ours, and ``TMPDIR`` and ``TRITON_CACHE_DIR``, which hold inductor's and
Triton's), so every pass times every baseline and compiles every task as if new to the machine.
A short pass over ``--warmup`` other tasks first loads the libraries from disk, which would
otherwise slow only the first pass.

    python bench/shared_gpu.py --tasks data/ops-6k-h200/tasks.parquet --n 80 --lanes 1 2 \\
        --pass-s 240 --out bench/results/shared_gpu_h200.json

``--compile-threads default 1`` runs each lane count twice: with inductor's default code-generation
processes in every reference worker (one per core) and with ``TORCHINDUCTOR_COMPILE_THREADS=1``
(keys ``lanes<k>`` and ``lanes<k>_ct1``): on a host whose cores are the limit, fewer processes to
start may judge more tasks a minute.

Each pass is stopped (SIGTERM) after ``--pass-s`` seconds; a pass need not judge every task.
Keys: ``runs.lanes<k>`` = the tasks-check summary (``tasks_per_min``: tasks judged over the pass's
wall time, start-up included; ``steady_tasks_per_min``: between the first and the last verdict to
finish; ``median_verdict_s``, ``median_phase_s``, counts); ``speedup.lanes<k>``: both rates over
one lane's; ``agreement.lanes<k>``: per baseline variant, the median and 90th percentile of
``|ms_k / ms_1 - 1|`` over the tasks both judged correct.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchlib import (Budget, check_medians, check_rates, device_held, machine_details, sample_task_files, tasks_check,
                      write_json)


def _fresh_caches(run: Path) -> dict[str, str]:
    """Environment that gives a pass inductor and Triton caches of its own, inside its run folder."""
    (run / "tmp").mkdir(parents=True, exist_ok=True)
    return {"TMPDIR": str(run / "tmp"), "TRITON_CACHE_DIR": str(run / "triton")}


def _agreement(rows: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any]:
    """How far each baseline's median time moves from the one-lane run's, task by task."""
    one = {r["task"]: r["baseline_ms"] for r in reference if r["status"] == "correct"}
    moved: dict[str, list[float]] = {}
    for row in rows:
        if row["status"] != "correct" or row["task"] not in one:
            continue
        for variant, ms in row["baseline_ms"].items():
            if one[row["task"]].get(variant):
                moved.setdefault(variant, []).append(abs(ms / one[row["task"]][variant] - 1))
    return {variant: {"tasks": len(values), "median_rel_diff": statistics.median(values),
                      "p90_rel_diff": sorted(values)[int(0.9 * (len(values) - 1))]}
            for variant, values in sorted(moved.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, required=True, help="a .parquet/.jsonl dataset or a folder of tasks")
    parser.add_argument("--n", type=int, default=60, help="tasks sampled from --tasks (fixed seed)")
    parser.add_argument("--lanes", nargs="+", type=int, default=[1, 2, 3], help="lanes per GPU to compare (1 first)")
    parser.add_argument("--warmup", type=int, default=3, help="tasks of the warm-up pass (0: none)")
    parser.add_argument("--compile-threads", nargs="+", default=["default"],
                        help="inductor code-generation processes per reference worker to compare: 'default' "
                             "(one per core) and/or counts (TORCHINDUCTOR_COMPILE_THREADS)")
    parser.add_argument("--gpus", default=None, help="GPUs to use, e.g. 0 (default: all visible)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/shared-gpu"))
    parser.add_argument("--pass-s", type=float, default=240, help="seconds each lane count runs for")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.lanes[0] != 1 or args.compile_threads[0] != "default":
        parser.error("--lanes must start with 1 and --compile-threads with default: the other passes are "
                     "compared with that one")
    if not all(threads == "default" or threads.isdigit() and int(threads) >= 1 for threads in args.compile_threads):
        parser.error(f"--compile-threads: expected 'default' or counts >= 1, got {' '.join(args.compile_threads)}")
    sample = sample_task_files(args.tasks, args.n, args.work / "sample")
    result: dict[str, Any] = {"machine": machine_details(), "tasks": str(args.tasks), "n": args.n, "runs": {},
                              "speedup": {}, "agreement": {}}
    if args.warmup:
        warmup = sample_task_files(args.tasks, args.warmup, args.work / "warmup_sample", 1, {p.name for p in sample.iterdir()})
        result["warmup"] = tasks_check(warmup, [], args.work / "warmup", Budget(args.pass_s), args.gpus,
                                       args.work / "cache_warmup",
                                       _fresh_caches(args.work / "warmup"))["counts"]
    for lanes in args.lanes:
        for threads in args.compile_threads:
            key = f"lanes{lanes}" if threads == "default" else f"lanes{lanes}_ct{threads}"
            env = _fresh_caches(args.work / key) | ({} if threads == "default" else
                                                    {"TORCHINDUCTOR_COMPILE_THREADS": threads})
            entry = tasks_check(sample, ["--lanes-per-gpu", str(lanes)], args.work / key, Budget(args.pass_s),
                                args.gpus, args.work / f"cache_{key}", env)
            entry.update(check_rates(entry), **check_medians(entry["problems"]), device_held=device_held(entry))
            result["runs"][key] = entry
            one = result["runs"]["lanes1"]
            if key != "lanes1":
                result["speedup"][key] = {rate: entry[rate] / one[rate] if entry[rate] and one[rate] else None
                                          for rate in ("tasks_per_min", "steady_tasks_per_min")}
                result["agreement"][key] = _agreement(entry["problems"], one["problems"])
            print(f"{key}: {entry['counts']} in {entry['wall_s']:.0f} s (exit {entry['returncode']}), "
                  f"{entry['tasks_per_min'] or 0:.1f} tasks/min, steady {entry['steady_tasks_per_min'] or 0:.1f}, "
                  f"median verdict {entry['median_verdict_s']} s", flush=True)
            write_json(result, args.out)
    print({k: result[k] for k in ("speedup", "agreement")})


if __name__ == "__main__":
    main()

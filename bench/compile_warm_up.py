"""Where a fresh reference worker's baseline time goes, with and without ``torch.compile`` warmed up.

A verdict whose baselines are not cached yet (a self-check, a task new to the cache) compiles the
task's model in a reference worker started for that task. This measures, per task and setting, in
a fresh process each: importing the worker, its device warm-up, the compile warm-up of a
prestarted slot (``ReferenceWorker.warm_compile``, when on), loading the task, compiling its model
(``compile``), and the four timed baseline loops (eager and compiled, TF32 off and on). Settings:
warm-up off/on, each with inductor's default compile workers and with
``TORCHINDUCTOR_COMPILE_THREADS=1``.

    python bench/compile_warm_up.py --tasks KernelBench/KernelBench/level1/19_ReLU.py ... --out bench/results/compile_warm_up_h100.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ["eager_tf32_off", "compile_tf32_off", "eager_tf32_on", "compile_tf32_on"]
SETTINGS = [(False, None), (True, None), (False, "1"), (True, "1")]
"""``(warm compile, TORCHINDUCTOR_COMPILE_THREADS)``; None: inductor's default."""


def measure_one(task: Path, device: str, warm_compile: bool) -> dict[str, Any]:
    """In this (fresh) process: the seconds of each step a reference worker takes for ``task``."""
    started = time.perf_counter()
    from cuda_agent.environment import reference_worker
    from cuda_agent.environment.config import TimingConfig

    out: dict[str, Any] = {"task": task.name, "warm_compile": warm_compile,
                           "compile_threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"),
                           "import_s": time.perf_counter() - started}
    worker = reference_worker.ReferenceWorker()
    out["warm_s"] = _seconds(worker.warm, {"device": device})
    if warm_compile:
        out["warm_compile_s"] = _seconds(worker.warm_compile, {"device": device, "mode": "default"})
    timing = dataclasses.asdict(TimingConfig())
    out["load_s"] = _seconds(worker.load, {"task_file": str(task), "device": device, "init_seed": 42,
                                           "precision": "faithful", "io_dir": "/tmp", "out_dir": "/tmp"})
    out["compile_s"] = _seconds(worker.compile, {"timing": timing, "seed": 42})
    loops: list[float] = []
    measure = reference_worker.measure

    def timed_loop(*args: Any, **kwargs: Any) -> Any:
        loop_started = time.perf_counter()
        try:
            return measure(*args, **kwargs)
        finally:
            loops.append(time.perf_counter() - loop_started)

    reference_worker.measure = timed_loop
    variants = VARIANTS if device == "cuda" else VARIANTS[:2]
    out["baselines_s"] = _seconds(worker.baselines, {"variants": variants, "seed": 42, "timing": timing, "timed_cpus": None})
    out["loops_s"] = dict(zip(variants, loops))
    return out


def _seconds(step, msg: dict[str, Any]) -> float:
    started = time.perf_counter()
    step(msg)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", type=Path, required=True, help="problem files (KernelBench format)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--timeout-s", type=float, default=120, help="per fresh process")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--one", nargs=2, metavar=("TASK", "WARM"), help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(Path(args.one[0]), args.device, args.one[1] == "1")), flush=True)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib import machine_details, write_json

    result: dict[str, Any] = {"machine": machine_details(), "runs": []}
    for task in args.tasks:
        for warm, threads in SETTINGS:
            env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
            if threads is not None:
                env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
            command = [sys.executable, __file__, "--device", args.device, "--out", str(args.out), "--tasks", str(task),
                       "--one", str(task), "1" if warm else "0"]
            try:
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout_s)
                run = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
                    "task": task.name, "warm_compile": warm, "compile_threads": threads, "error": done.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                run = {"task": task.name, "warm_compile": warm, "compile_threads": threads, "error": "timed out"}
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
            write_json(result, args.out)


if __name__ == "__main__":
    main()

"""Verdicts at KernelBench's real sizes: seconds per verdict from 0.25 to 16 GB, memory, the
self-check over whole levels, and KernelBench's own harness on the same problem in the same run.

Parts (``--parts``; each writes its keys into the JSON as soon as it has them, so a run stopped by
its time limit keeps what it measured):

- ``sizes``: the honest float4 CUDA ReLU (examples/solutions/cuda/relu.py) on ReLU problems of
  0.25, 1, 4 GB and the real ``level1/19_ReLU`` (6.4 GB), and an honest kernel for the real
  ``level1/45_Average_Pooling_2D`` (17.2 GB; bench/solutions/avg_pool_2d_cuda.py). Per size: one
  priming verdict (build and baselines), then ``warm`` (build and baselines cached, workers
  prestarted, as ``verify --keep-warm`` serves) and ``cold`` (a fresh variant of the solution, so
  the build is not cached; baselines cached; workers started for it). The device's memory in use
  is sampled with nvidia-smi throughout: ``peak_device_gb`` is the whole GPU's, and each verdict's
  ``device_peak_during`` names the worker requests in flight when it was read. Keys: ``verdict_s``,
  ``seconds_per_gb_slope`` (least squares over the warm verdicts from 1 GB up), ``peak_host_gb``,
  ``peak_device_gb``.
- ``kernelbench``: KernelBench's own ``eval_kernel_against_ref`` (5 correctness and 100 timed
  trials) on 19_ReLU with the same solution, in a fresh process, twice (the second with its build
  cached: the one reported). KernelBench is used unchanged from a checkout given with
  ``--kernelbench`` (outside this repository); its package imports LLM clients at import time,
  which this harness never calls: where ``litellm`` or ``openai`` is not installed, a module that
  raises when called stands in for it. Keys: ``kernelbench_harness_s``, ``speedup_vs_kernelbench``.
- ``selfcheck``: ``cuda-agent tasks check`` over KernelBench levels (``--levels``), resumable in
  ``--work``. Keys: ``selfcheck.level<N>`` = {tasks, correct, task_error, infra_error, wall_s,
  complete}.
- ``synth``: ``tasks check`` over a fixed 100-task sample of data/synth-h100, then the same tasks
  again into a second run folder: the first pass times every baseline (a task new to the machine),
  the second finds them in the baseline cache (every later verdict of a task, as in RL rollouts).
  Keys: ``synth_sample.median_verdict_s`` and ``synth_sample_cached.median_verdict_s``, each with
  ``median_phase_s`` (where a median verdict's time goes).

Every ``tasks check`` runs with ``$CUDA_AGENT_CACHE_DIR`` set to ``--cache-dir`` (default
``<work>/cache``) and is stopped by SIGTERM when the time budget ends: it stops its workers and
keeps its stored results, and the next run continues it.

    python bench/real_sizes.py --kernelbench ../KernelBench --out bench/results/real_sizes_h100.json
    python bench/real_sizes.py --parts selfcheck --levels 1 --kernelbench ../KernelBench --work /tmp/rs \\
        --out bench/results/real_sizes_4gpu.json --selfcheck-key selfcheck_4gpu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import (
    EXAMPLES, REPO, Budget, check_medians, machine_details, make_variant, sample_task_files, tasks_check, write_json,
)

from cuda_agent.environment import EvalConfig, Prestarter, evaluate, load_task, slots

RELU_SOLUTION = EXAMPLES / "solutions" / "cuda" / "relu.py"
AVG_POOL_SOLUTION = Path(__file__).resolve().parent / "solutions" / "avg_pool_2d_cuda.py"
RELU_ROWS = 4096
_RELU_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.rand({rows}, {cols})]


def get_init_inputs():
    return []
'''


class DeviceMemoryPeak:
    """The most memory in use on the verdicts' GPU (the first ``CUDA_VISIBLE_DEVICES`` entry, else
    0: other GPUs of the host may run other work) while the block runs, sampled by nvidia-smi every
    100 ms, and when it was read (``time.monotonic()``, to find the worker requests in flight then)."""

    def __init__(self) -> None:
        self.peak_mib, self.peak_at = 0, 0.0
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "DeviceMemoryPeak":
        self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                       "-i", _verdict_gpu(), "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            if line.strip().isdigit() and int(line) > self.peak_mib:
                self.peak_mib, self.peak_at = int(line), time.monotonic()

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.3)
        self._proc.terminate()
        self._proc.wait()


def _verdict_gpu() -> str:
    """The GPU this process's verdicts run on, as nvidia-smi's ``-i`` takes it (index or UUID)."""
    return (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"


def _relu_task(folder: Path, gigabytes: float) -> Path:
    cols = round(gigabytes * 1e9 / 4 / RELU_ROWS)
    path = folder / f"relu_{gigabytes:g}gb.py"
    path.write_text(_RELU_TASK.format(rows=RELU_ROWS, cols=cols))
    return path


def _problems(kernelbench: Path | None, sizes: list[float], work: Path,
              pooling: bool) -> list[tuple[str, float, Path, Path]]:
    """``(name, input GB, task file, solution)`` in size order."""
    problems = []
    for gigabytes in sizes:
        real = kernelbench / "KernelBench" / "level1" / "19_ReLU.py" if kernelbench else None
        if gigabytes == 6.44 and real is not None and real.is_file():
            problems.append(("19_ReLU", 6.44, real, RELU_SOLUTION))
        else:
            problems.append((f"relu_{gigabytes:g}gb", gigabytes, _relu_task(work, gigabytes), RELU_SOLUTION))
    real = kernelbench / "KernelBench" / "level1" / "45_Average_Pooling_2D.py" if kernelbench else None
    if pooling and real is not None and real.is_file():
        problems.append(("45_Average_Pooling_2D", 17.18, real, AVG_POOL_SOLUTION))
    return problems


def _verdict(task: Path, solution: Path, config: EvalConfig, prestarted: Prestarter | None = None) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    close = slots.WorkerSlot.close

    def close_and_record(slot: slots.WorkerSlot) -> None:  # each worker request's timing, in order
        requests.append({name: worker.request_seconds
                         for name, worker in (("reference", slot.reference), ("candidate", slot.candidate)) if worker})
        close(slot)

    slots.WorkerSlot.close = close_and_record
    started = time.monotonic()
    try:
        with DeviceMemoryPeak() as device:
            verdict = evaluate(load_task(task), solution, config, prestarted=prestarted)
    finally:
        slots.WorkerSlot.close = close
    seconds = time.monotonic() - started
    at_peak = [f"{worker}:{op}" for slot in requests for worker, timings in slot.items()
               for op, sent, took in timings if sent <= device.peak_at <= sent + took]
    return {"verdict_s": seconds, "status": verdict.status.value, "error": (verdict.error or "")[:2000],
            "reward": verdict.reward, "phase_seconds": verdict.phase_seconds, "memory_mb": verdict.memory_mb,
            "problem_bytes": verdict.problem_bytes, "device_peak_gb": device.peak_mib * 2**20 / 1e9,
            "device_peak_during": at_peak,  # the worker requests in flight when the peak was read
            "notes": verdict.notes, "build_cached": bool(verdict.build and verdict.build.cached),
            "speedup_vs_eager": verdict.speedup_vs_eager,
            "requests": [{worker: [[op, took] for op, _, took in timings] for worker, timings in slot.items()}
                         for slot in requests]}


def measure_sizes(args: argparse.Namespace, result: dict[str, Any], budget: Budget) -> None:
    """Prime, warm and cold verdicts per problem size."""
    config = EvalConfig(device="cuda", cache_dir=args.cache_dir)
    runs: dict[str, Any] = result.setdefault("sizes", {})
    for name, gigabytes, task, solution in _problems(args.kernelbench, args.sizes, args.work, args.pooling):
        if budget.spent():
            break
        entry: dict[str, Any] = {"input_gb": gigabytes}
        runs[name] = entry
        entry["prime"] = _verdict(task, solution, config)
        print(f"{name}: prime {entry['prime']['verdict_s']:.1f} s {entry['prime']['status']}", flush=True)
        with Prestarter(config) as prestarted:  # as a keep-warm evaluator between calls: its slot is ready
            prestarted.wait_ready(120)
            entry["warm"] = _verdict(task, solution, config, prestarted)
        entry["cold"] = _verdict(task, make_variant(solution, int(gigabytes * 100), args.work), config)
        print(f"{name}: warm {entry['warm']['verdict_s']:.1f} s, cold {entry['cold']['verdict_s']:.1f} s "
              f"({entry['warm']['status']}, device peak {entry['warm']['device_peak_gb']:.1f} GB)", flush=True)
        _summarise_sizes(result)
        write_json(result, args.out)


def _summarise_sizes(result: dict[str, Any]) -> None:
    runs = result["sizes"]
    result["verdict_s"] = {name: {kind: run[kind]["verdict_s"] for kind in ("warm", "cold") if kind in run}
                           for name, run in runs.items()}
    points = [(run["input_gb"], run["warm"]["verdict_s"]) for run in runs.values()
              if "warm" in run and run["input_gb"] >= 1 and run["warm"]["status"] == "correct"]
    if len(points) >= 2:
        mean_x = statistics.fmean(x for x, _ in points)
        mean_y = statistics.fmean(y for _, y in points)
        spread = sum((x - mean_x) ** 2 for x, _ in points)
        result["seconds_per_gb_slope"] = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    verdicts = [run[kind] for run in runs.values() for kind in ("prime", "warm", "cold") if kind in run]
    result["peak_host_gb"] = max((m.get("peak_host_mb", 0) * 2**20 / 1e9 for v in verdicts
                                  for m in v["memory_mb"].values()), default=None)
    result["peak_device_gb"] = {name: max(run[kind]["device_peak_gb"] for kind in ("prime", "warm", "cold") if kind in run)
                                for name, run in runs.items()}


_STAND_IN = '''"""Stand-in for {name}, an LLM client KernelBench imports at import time and its evaluation never
calls (this machine cannot reach an LLM service): any name can be imported, and using it raises."""


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("{name} is not available in this benchmark (KernelBench's harness never calls it)")

    def __call__(self, *args, **kwargs):
        raise RuntimeError("{name} is not available in this benchmark (KernelBench's harness never calls it)")


def __getattr__(attribute):
    return _Unavailable
'''

_KERNELBENCH_RUN = '''
import json, sys, time
sys.path.insert(0, {src!r}); sys.path.append({stand_ins!r})
from kernelbench.eval import eval_kernel_against_ref
ref = open({task!r}).read(); custom = open({solution!r}).read()
started = time.monotonic()
result = eval_kernel_against_ref(ref, custom, num_correct_trials=5, num_perf_trials=100, measure_performance=True,
                                 build_dir={build!r})
print(json.dumps({{"seconds": time.monotonic() - started, "correctness": result.correctness,
                  "runtime_us": result.runtime, "compiled": result.compiled}}))
'''


def measure_kernelbench(args: argparse.Namespace, result: dict[str, Any], budget: Budget) -> None:
    """KernelBench's harness on 19_ReLU with the same solution, fresh process, twice."""
    task = args.kernelbench / "KernelBench" / "level1" / "19_ReLU.py"
    stand_ins = args.work / "stand_ins"
    stand_ins.mkdir(exist_ok=True)
    for name in ("litellm", "openai"):
        (stand_ins / f"{name}.py").write_text(_STAND_IN.format(name=name))
    script = _KERNELBENCH_RUN.format(src=str(args.kernelbench / "src"), stand_ins=str(stand_ins), task=str(task),
                                     solution=str(RELU_SOLUTION), build=str(args.work / "kernelbench_build"))
    runs = []
    for _ in range(2):
        if budget.left_s() < 60:
            break
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=max(60, budget.left_s()))
        wall = time.monotonic() - started
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        runs.append({"wall_s": wall, "returncode": done.returncode,
                     "result": json.loads(last) if last.startswith("{") else None,
                     "stderr_tail": done.stderr[-1500:]})
        print(f"KernelBench harness: {wall:.1f} s (exit {done.returncode})", flush=True)
    result["kernelbench_runs"] = runs
    if len(runs) == 2 and runs[1]["returncode"] == 0:
        result["kernelbench_harness_s"] = runs[1]["wall_s"]
        ours = result.get("sizes", {}).get("19_ReLU", {}).get("warm", {}).get("verdict_s")
        if ours:
            result["speedup_vs_kernelbench"] = runs[1]["wall_s"] / ours
    write_json(result, args.out)


def measure_selfcheck(args: argparse.Namespace, result: dict[str, Any], budget: Budget) -> None:
    section = result.setdefault(args.selfcheck_key, {})
    for level in args.levels:
        if budget.spent():
            break
        entry = tasks_check(args.kernelbench, ["--level", str(level)], args.work / f"level{level}", budget, args.gpus,
                             args.cache_dir)
        previous = section.get(f"level{level}", {})
        entry["wall_s"] += previous.get("wall_s", 0.0) if not previous.get("complete", True) else 0.0
        section[f"level{level}"] = entry
        print(f"tasks check level {level}: {entry['counts']} in {entry['wall_s']:.0f} s"
              + ("" if entry["complete"] else " (stopped by the budget: rerun to continue)"), flush=True)
        write_json(result, args.out)


def measure_synth(args: argparse.Namespace, result: dict[str, Any], budget: Budget) -> None:
    """``tasks check`` over 100 tasks of data/synth-h100 picked with a fixed seed."""
    sample = sample_task_files(REPO / "data" / "synth-h100" / "tasks.parquet", 100, args.work / "synth_sample")
    for key, folder in (("synth_sample", "synth_check"), ("synth_sample_cached", "synth_cached")):
        if budget.spent():
            break
        entry = tasks_check(sample, [], args.work / folder, budget, args.gpus, args.cache_dir)
        entry.update(check_medians(entry["problems"]))
        result[key] = entry
        print(f"{key}: {entry['counts']}, median verdict {entry['median_verdict_s']} s", flush=True)
        write_json(result, args.out)
        if not entry["complete"]:
            break  # the cached pass needs every baseline of the first


PARTS = {"sizes": measure_sizes, "kernelbench": measure_kernelbench, "selfcheck": measure_selfcheck,
         "synth": measure_synth}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=["sizes", "kernelbench"])
    parser.add_argument("--sizes", nargs="+", type=float, default=[0.25, 1.0, 4.0, 6.44],
                        help="ReLU input sizes in GB (6.44: the real level1/19_ReLU when --kernelbench is given)")
    parser.add_argument("--pooling", action=argparse.BooleanOptionalAction, default=True,
                        help="also the real level1/45_Average_Pooling_2D (17 GB of inputs)")
    parser.add_argument("--kernelbench", type=Path, help="a KernelBench checkout (its KernelBench/ and src/ folders)")
    parser.add_argument("--levels", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--selfcheck-key", default="selfcheck", help="JSON key of the self-check part")
    parser.add_argument("--gpus", default=None, help="GPUs the self-check and synth parts use, e.g. 0 (default: all visible)")
    parser.add_argument("--work", type=Path, default=None, help="folder for tasks, builds and resumable runs")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--time-budget-s", type=float, default=540)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.work = args.work or Path(tempfile.mkdtemp(prefix="real-sizes-"))
    args.work.mkdir(parents=True, exist_ok=True)
    args.cache_dir = args.cache_dir or args.work / "cache"
    needs_kernelbench = {"kernelbench", "selfcheck"} & set(args.parts)
    if needs_kernelbench and (args.kernelbench is None or not (args.kernelbench / "KernelBench").is_dir()):
        parser.error("--parts kernelbench/selfcheck need --kernelbench pointing at a KernelBench checkout")
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result["machine"] = machine_details()
    budget = Budget(args.time_budget_s)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for part in args.parts:
        PARTS[part](args, result, budget)
    write_json(result, args.out)
    print(json.dumps({k: result.get(k) for k in ("verdict_s", "seconds_per_gb_slope", "peak_device_gb",
                                                 "kernelbench_harness_s", "speedup_vs_kernelbench")}, default=str))


if __name__ == "__main__":
    main()

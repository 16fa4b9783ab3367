"""Seconds per evaluation with the workers exec'd against forked from a worker zygote, side by side.

One process evaluates a bundled sample (its build and baselines cached by a first, uncounted
evaluation) ``--runs`` times per series: each worker start (``exec``: fresh ``python -m``
interpreters, ``CUDA_AGENT_WORKER_START=exec``; ``fork``: forked by the zygote) one-shot (the
evaluation starts its own slot) and prestarted (a ``Prestarter`` of one slot, evaluations back to
back, as a pool lane runs them). Per series: wall seconds, median ``phase_seconds`` (``workers`` is
waiting for a slot, ``prepare`` includes a one-shot slot's warm-up), statuses (all must be
``correct``: a forked worker must judge as an exec'd one). The zygote's own start (once per
process) is the first fork series' first call, reported apart. Prints a summary, writes JSON.

    python bench/worker_start.py --device cpu --out bench/results/worker_start_cpu.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchlib import EXAMPLES, device_label, machine_details, median, median_phases, sample_solution, write_json

from cuda_agent.cli_support import default_device
from cuda_agent.environment import EvalConfig, Status, evaluate, load_task
from cuda_agent.environment.slots import Prestarter

STARTS = ("exec", "fork")


def _series(task, solution: Path, config: EvalConfig, runs: int, prestarted: bool) -> dict:
    walls, verdicts = [], []
    prestarter = Prestarter(config) if prestarted else None
    try:
        for _ in range(runs):
            started = time.perf_counter()
            verdicts.append(evaluate(task, solution, config, prestarted=prestarter))
            walls.append(time.perf_counter() - started)
    finally:
        if prestarter is not None:
            prestarter.close()
    statuses = [verdict.status.value for verdict in verdicts]
    if any(verdict.status is not Status.CORRECT for verdict in verdicts):
        raise SystemExit(f"an evaluation was not correct: {[v.error for v in verdicts if v.error]}")
    return {"calls_s": walls, "median_s": median(walls), "statuses": statuses,
            "median_phase_seconds": median_phases([verdict.phase_seconds for verdict in verdicts]),
            "prestarted": [verdict.environment["prestarted"] for verdict in verdicts]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--task", default="relu", help="sample task name under examples/tasks")
    parser.add_argument("--runs", type=int, default=5, help="evaluations per series")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args()

    device = args.device or default_device()
    task = load_task(EXAMPLES / "tasks" / f"{args.task}.py")
    solution = sample_solution(device, args.task, "single")
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-worker-start-"))
    config = EvalConfig(device=device, cache_dir=workspace / "cache")
    series: dict[str, dict] = {}
    zygote_first_call_s = None
    try:
        os.environ["CUDA_AGENT_WORKER_START"] = "exec"
        evaluate(task, solution, config)  # the build and the baselines: every counted evaluation finds them
        for start in STARTS:
            os.environ["CUDA_AGENT_WORKER_START"] = start
            if start == "fork":
                started = time.perf_counter()
                evaluate(task, solution, config)  # starts this process's zygote
                zygote_first_call_s = time.perf_counter() - started
            for prestarted in (False, True):
                key = f"{start}_{'prestarted' if prestarted else 'one_shot'}"
                series[key] = _series(task, solution, config, args.runs, prestarted)
    finally:
        os.environ.pop("CUDA_AGENT_WORKER_START", None)
        shutil.rmtree(workspace, ignore_errors=True)
    ratios = {kind: series[f"exec_{kind}"]["median_s"] / series[f"fork_{kind}"]["median_s"]
              for kind in ("one_shot", "prestarted")}
    details = machine_details()
    result = {"device": device_label(details), "machine": details, "task": args.task, "runs": args.runs,
              "series": series, "exec_over_fork": ratios, "zygote_first_call_s": zygote_first_call_s}
    print(f"{args.task} on {device}, median s per evaluation (exec / fork): one-shot "
          f"{series['exec_one_shot']['median_s']:.2f} / {series['fork_one_shot']['median_s']:.2f} "
          f"({ratios['one_shot']:.1f}x); prestarted {series['exec_prestarted']['median_s']:.2f} / "
          f"{series['fork_prestarted']['median_s']:.2f} ({ratios['prestarted']:.1f}x); the zygote's first call "
          f"{zygote_first_call_s:.1f} s")
    write_json(result, args.out)


if __name__ == "__main__":
    main()

"""Seconds per ``cuda-agent verify`` call as typed: a plain call against ``--keep-warm``.

Every call is a fresh ``cuda-agent verify TASK SOLUTION --json`` process with the build and the
baselines cached (one call first fills the cache, not counted). ``--calls`` plain calls, then for
each ``--think-s`` a keep-warm evaluator of its own: a first call that starts it, then ``--calls``
calls that many seconds apart (0: back to back, as a script loops; more: an agent generating
between calls). Per call: wall seconds, the verdict's ``phase_seconds`` (where the time went
inside), the candidate's timing spread (``candidate_rel_std_err``: a slot started during the
timing would show here). The command's own part, outside the evaluation, is the wall time less
``phase_seconds.total`` (``client_median_s``). Each series records the 1-minute load average
before and after it (``load_1min``): other work on the machine shows there. Prints a one-line
summary and writes JSON.

    python bench/keep_warm.py --device cpu --out bench/results/keep_warm_cpu.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from benchlib import cli_keep_warm, cli_verify, device_label, machine_details, median, median_phases, write_json

from cuda_agent.cli import examples_dir
from cuda_agent.cli_support import default_device


def _summary(calls: list[tuple[float, dict]], load_before: float) -> dict:
    """Seconds per call and their medians, from ``(wall seconds, verdict)`` pairs, and the load
    average before (``load_before``) and after them."""
    walls = [wall for wall, _ in calls]
    return {
        "load_1min": [load_before, os.getloadavg()[0]], "calls_s": walls, "median_s": median(walls),
        "client_median_s": median([wall - verdict["phase_seconds"]["total"] for wall, verdict in calls]),
        "median_phase_seconds": median_phases([verdict["phase_seconds"] for _, verdict in calls]),
        "candidate_rel_std_err": [verdict["candidate_timing"]["rel_std_err"] for _, verdict in calls],
        "prestarted": [verdict["environment"]["prestarted"] for _, verdict in calls],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--task", default="relu", help="sample task name under examples/tasks")
    parser.add_argument("--calls", type=int, default=5, help="timed calls per kind (plain, and per --think-s)")
    parser.add_argument("--think-s", type=float, nargs="+", default=[0.0, 3.0, 8.0],
                        help="pauses between keep-warm calls to measure (an agent's generation time)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="build/baseline cache to use (default: a fresh temporary one)")
    args = parser.parse_args()

    device = args.device or default_device()
    root = examples_dir()
    task, solution = root / "tasks" / f"{args.task}.py", root / "solutions" / device / f"{args.task}.py"
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-keep-warm-"))
    env = {"CUDA_AGENT_CACHE_DIR": str(args.cache_dir or workspace / "cache"),
           "CUDA_AGENT_WARM_DIR": str(workspace / "warm")}
    (workspace / "warm").mkdir(mode=0o700)
    try:
        cli_verify(task, solution, device, env)  # builds and times the baselines: every counted call finds them
        load = os.getloadavg()[0]
        plain = _summary([cli_verify(task, solution, device, env) for _ in range(args.calls)], load)
        keep_warm = []
        for think_s in args.think_s:
            load = os.getloadavg()[0]
            first, *later = cli_keep_warm(task, solution, device, env, args.calls, think_s)
            keep_warm.append({"think_s": think_s, "first_call_s": first[0], **_summary(later, load)})
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    details = machine_details()
    result = {"device": device_label(details), "machine": details, "task": args.task, "solution": str(solution),
              "plain": plain, "keep_warm": keep_warm}
    print(f"{args.task} on {device}: plain `cuda-agent verify` median {plain['median_s']:.2f} s; --keep-warm "
          + ", ".join(f"{row['median_s']:.2f} s with {row['think_s']:g} s between calls" for row in keep_warm)
          + f" (first call {keep_warm[0]['first_call_s']:.1f} s)")
    write_json(result, args.out)


if __name__ == "__main__":
    main()

"""Where one evaluation's wall time goes: phases and every worker request, cold and cached.

Runs sample task/solution pairs through :func:`evaluate` (a fresh cache: the first run builds and
times the baselines; later runs hit both caches), and records for each run the verdict's
``phase_seconds`` and the wall time of every request to the reference and candidate workers, in
order. Also times one ``cuda-agent verify --json`` as a user types it (cached build). Prints a table
and writes JSON.

    python bench/verdict_breakdown.py --device cuda --tasks relu softmax --runs 3 --out bench/results/breakdown_cuda.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import EXAMPLES, device_label, machine_details, write_json

from cuda_agent.environment import EvalConfig, evaluate, load_task
from cuda_agent.environment import slots


def _recording_close(requests: list) -> None:
    """Have every closed slot hand its workers' request timings to ``requests``."""
    close = slots.WorkerSlot.close

    def close_and_record(slot: slots.WorkerSlot) -> None:
        requests.append({name: [[op, s] for op, _, s in worker.request_seconds]
                         for name, worker in (("reference", slot.reference), ("candidate", slot.candidate))
                         if worker is not None})
        started = time.monotonic()
        close(slot)
        requests[-1]["close_s"] = time.monotonic() - started

    slots.WorkerSlot.close = close_and_record


def _cli_verify(task: Path, solution: Path, device: str, cache_dir: Path) -> dict:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "verify", str(task), str(solution), "--device", device,
                           "--json"], capture_output=True, text=True, env={**__import__("os").environ,
                                                                           "CUDA_AGENT_CACHE_DIR": str(cache_dir)})
    wall = time.monotonic() - started
    try:
        verdict = json.loads(proc.stdout)
    except json.JSONDecodeError:
        verdict = {"stdout": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}
    return {"wall_s": wall, "phase_seconds": verdict.get("phase_seconds"), "reward": verdict.get("reward"),
            "status": verdict.get("status"), "error": verdict.get("error")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tasks", nargs="+", default=["relu"])
    parser.add_argument("--runs", type=int, default=3, help="runs per task (the first one cold)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    cache_dir = Path(tempfile.mkdtemp(prefix="cuda-agent-breakdown-"))
    config = EvalConfig(device=args.device, cache_dir=cache_dir)
    requests: list = []
    _recording_close(requests)
    details = machine_details()
    result = {"machine": details, "device": device_label(details), "runs": [], "cli": []}
    for name in args.tasks:
        task_path = EXAMPLES / "tasks" / f"{name}.py"
        solution = EXAMPLES / "solutions" / args.device / f"{name}.py"
        task = load_task(task_path)
        for run in range(args.runs):
            started = time.monotonic()
            verdict = evaluate(task, solution, config)
            wall = time.monotonic() - started
            entry = {"task": name, "run": run, "wall_s": wall, "status": verdict.status.value, "reward": verdict.reward,
                     "phase_seconds": verdict.phase_seconds, "requests": requests[-1] if requests else None,
                     "candidate_ms": verdict.candidate_ms, "timing": verdict.candidate_timing.__dict__
                     if verdict.candidate_timing else None, "error": verdict.error}
            result["runs"].append(entry)
            print(f"{name} run {run}: {wall:.2f} s {verdict.status.value} reward {verdict.reward} "
                  f"phases {json.dumps({k: round(v, 2) for k, v in verdict.phase_seconds.items()})}", flush=True)
            for worker, ops in (entry["requests"] or {}).items():
                if isinstance(ops, list):
                    print(f"   {worker}: " + " ".join(f"{op}={s:.2f}" for op, s in ops), flush=True)
            if args.out:
                write_json(result, args.out)
        result["cli"].append({"task": name, **_cli_verify(task_path, solution, args.device, cache_dir)})
        print(f"{name} cli verify (cached): {result['cli'][-1]}", flush=True)
        if args.out:
            write_json(result, args.out)


if __name__ == "__main__":
    main()

"""Does the same solution get the same reward? Repeated full verdicts of fixed solutions.

The problem is ``bench/solutions/matvec_chain/task.py``, y = (A B) v, at three sizes whose eager
time is about 10 µs, 100 µs and 1 ms on this device (``n`` found by timing eager in this process
first; the harness's own eager times are in the JSON). Its candidate computes A (B v) in the
fast contract and takes a work factor (``WORK``), so one kernel (one build) gives three
solutions per size:

- ``faster``: work 1, an O(n^2) kernel against the O(n^3) reference: clearly faster than eager
  and ``torch.compile`` (neither reassociates the product);
- ``near``: the work that puts its speed-up over eager at the milestone threshold (1.05 under
  ``strict``), found by verdicts at a few work factors;
- ``slower``: the work for a speed-up of 0.75, slower than eager.

A size's first verdict times its baselines; baselines more than 10x slower than eager here
stalled on a busy machine and are timed again, 30 s later (``baselines_stalled`` counts it).
Each solution then gets ``--repeats`` verdicts (``evaluate``: build cached, prestarted workers,
baselines from the cache while they fit, as in RL training). Per solution: the median speed-up
over eager, its relative distance from the nearest threshold that can change the reward
(``threshold_distance``), the share of verdicts that got the most common reward
(``reward_agreement``), the same for the reward the measured speed-ups alone would give
(``point_estimate_agreement``: no confidence bound), the coefficient of variation of
``candidate_ms`` over the verdicts, and how much of it one verdict's median error does not explain
(``between_verdict_rel_err``: the figure ``reward.drift`` stands for, which ``--drift`` sets).
On CUDA each verdict's SM clock after the candidate's timing is kept too (``sm_clock_mhz``): a
verdict whose whole timing ran slow can be checked against it. Prints one summary line and writes
JSON after every solution.

    python bench/reward_stability.py --device cpu --repeats 20 --out bench/results/reward_stability_cpu.json
    python bench/reward_stability.py --device cuda --sizes 10us --time-budget-s 540 \\
        --cache-dir /tmp/rs-cache --out bench/results/reward_stability_cuda.json
    python bench/reward_stability.py --device cuda --sizes 100us --append ...   # then 1ms: one size per call
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchlib import REPO, SMOKE_TIMING, Budget, device_label, machine_details, write_json

from cuda_agent.environment import EvalConfig, Prestarter, Verdict, evaluate, load_task
from cuda_agent.environment.baselines import BaselineCache
from cuda_agent.environment.machine_load import current_load
from cuda_agent.environment.presets import PRESETS
from cuda_agent.environment.reward import MILESTONES, drift_for, milestone_reward
from cuda_agent.environment.slots import default_prestart_slots

SOLUTION = REPO / "bench" / "solutions" / "matvec_chain"
SIZES_MS = {"10us": 0.01, "100us": 0.1, "1ms": 1.0}
"""Eager time each size aims at."""
SLOWER_SPEEDUP = 0.75
STALLED = 10.0
"""A baseline this many times slower than eager timed here (plus 0.5 ms) stalled on a busy machine."""


def eager_ms(n: int, device: str) -> float:
    """The fastest of at least 20 eager ``(A @ B) @ v`` calls here, over 50 ms after as long a
    warm-up (thread pools started, clocks up): other processes only ever slow a call down, so the
    fastest is what the size costs. On the CPU with one thread: a call split over busy cores waits
    for the slowest (milliseconds under load), the harness's workers use them all."""
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    a, b, v = (torch.randn(*shape, device=device) for shape in ((n, n), (n, n), (n,)))
    times: list[float] = []
    with torch.no_grad():
        for phase in ("warm-up", "timed"):
            times.clear()
            until = time.perf_counter() + 0.05
            while len(times) < 20 or time.perf_counter() < until:
                if device == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                (a @ b) @ v
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - started) * 1e3)
    return min(times)


def size_for(target_ms: float, device: str) -> tuple[int, float]:
    """The ``n`` (a multiple of 16) whose eager time here is nearest ``target_ms`` on a log scale,
    and that time."""
    n, previous = 16, None
    while True:
        took = eager_ms(n, device)
        if took >= target_ms or n >= 8192:
            if previous is not None and abs(math.log(previous[1] / target_ms)) < abs(math.log(took / target_ms)):
                return previous
            return n, took
        previous, n = (n, took), max(n + 16, int(n * 1.25) // 16 * 16)


def sized_task(n: int, workspace: Path) -> Path:
    text, count = re.subn(r"^n = \d+$", f"n = {n}", (SOLUTION / "task.py").read_text(), flags=re.MULTILINE)
    if count != 1:
        raise SystemExit(f"{SOLUTION / 'task.py'}: no line 'n = <int>' to resize")
    path = workspace / f"matvec_chain_{n}.py"
    path.write_text(text)
    return path


def workdir(device: str, work: float, workspace: Path) -> Path:
    """The candidate's workdir with ``WORK = work``: the same kernels (one build) for every work."""
    target = workspace / f"matvec_chain_{device}_work{work:.6g}"
    if not target.exists():
        shutil.copytree(SOLUTION / f"kernels_{device}", target / "kernels")
        text, count = re.subn(r"^WORK = .*$", f"WORK = {work!r}", (SOLUTION / "model_new.py").read_text(),
                              flags=re.MULTILINE)
        if count != 1:
            raise SystemExit(f"{SOLUTION / 'model_new.py'}: no line 'WORK = ...' to set")
        (target / "model_new.py").write_text(text)
    return target


@dataclass
class Run:
    """One solution's verdicts."""

    name: str
    size: str
    work: float
    verdicts: list[Verdict] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)


def judge(task_path: Path, solution: Path, config: EvalConfig, prestarted: Prestarter) -> Verdict:
    verdict = evaluate(load_task(task_path), solution, config, prestarted=prestarted)
    if not verdict.correct or verdict.speedup_vs_eager is None:
        raise SystemExit(f"{solution.name}: {verdict.status.value}: {verdict.error}")
    return verdict


def timed_baselines(task_path: Path, here_ms: float, config: EvalConfig, prestarted: Prestarter,
                    workspace: Path) -> tuple[Verdict, int]:
    """The first verdict of a size (work 1), which times its baselines, and how many times they
    were timed again because they came out more than ``STALLED`` times slower than eager here (a
    loaded machine stalls torch's threads for a scheduler slice per call: milliseconds for a
    microsecond problem). The bench measures reward stability against honest baselines; each
    stall found is reported in the JSON, not hidden."""
    cache = BaselineCache(config.cache_dir / "baselines.sqlite")
    for retries in range(4):
        verdict = judge(task_path, workdir(config.device, 1.0, workspace), config, prestarted)
        if max(verdict.eager_ms, verdict.compile_ms or 0.0) <= STALLED * here_ms + 0.5:
            return verdict, retries
        print(f"  {task_path.stem}: baselines stalled (eager {verdict.eager_ms:.4g} ms, compile "
              f"{verdict.compile_ms} ms, {here_ms:.4g} ms here); timing them again in 30 s", file=sys.stderr, flush=True)
        cache.clear([load_task(task_path).code_hash])
        time.sleep(30)
    raise SystemExit(f"{task_path.name}: the baselines stalled 4 times: the machine is too busy to measure")


def calibrate(task_path: Path, first: Verdict, config: EvalConfig, prestarted: Prestarter, workspace: Path,
              steps: int, smoke: bool) -> dict[str, float]:
    """Work factors for the three solutions, from ``first`` (work 1) on. The candidate's time
    grows about linearly with the work: steps of at most 4x from work 1 bracket the work whose
    speed-up over eager is the threshold, then the line between the bracket's ends closes in on
    it (within 2 %, ``steps`` verdicts at most); a least-squares line through every point gives
    the work for the slower one."""
    eager, points = first.eager_ms, [(1.0, first.candidate_ms)]
    target_ms = eager / MILESTONES.get(config.reward.milestone)
    if first.candidate_ms >= target_ms:  # more work only slows it: the three solutions are one
        print(f"  {task_path.stem}: the candidate at work 1 ({first.candidate_ms:.4g} ms) already misses the "
              f"threshold ({target_ms:.4g} ms): no solution near or above it at this size", file=sys.stderr, flush=True)
        return {"faster": 1.0, "near": 1.0, "slower": 1.0}
    below, above = points[0], None  # the nearest points under and over the target time
    work = max(2.0, target_ms / first.candidate_ms)  # as if the time grew in proportion
    for _ in range(steps):
        took = judge(task_path, workdir(config.device, work, workspace), config, prestarted).candidate_ms
        points.append((work, took))
        if abs(took / target_ms - 1) < 0.02:
            break
        if took < target_ms:
            below = max(below, (work, took))
        else:
            above = min(above or (work, took), (work, took))
        if above is None:
            slope = (took - below[1]) / (work - below[0]) if work != below[0] else 0.0
            step = (target_ms - took) / slope if slope > 0 else math.inf
            work = work + min(step, 3 * work)
        else:
            (w0, t0), (w1, t1) = below, above
            work = w0 + (w1 - w0) * (target_ms - t0) / (t1 - t0)
    slope, intercept = statistics.linear_regression([w for w, _ in points], [t for _, t in points])
    if slope <= 0 and not smoke:
        raise SystemExit(f"{task_path.name}: the candidate did not slow down with more work: {points}")
    if slope <= 0:  # smoke timings are too short to tell work apart: any works above the near one do
        slope, intercept = points[0][1], 0.0
    print(f"  {task_path.stem}: eager {eager:.4g} ms; candidate (work, ms): {points}", file=sys.stderr, flush=True)
    return {"faster": 1.0, "near": work, "slower": max(1.0, (eager / SLOWER_SPEEDUP - intercept) / slope)}


def measure(run: Run, task_path: Path, config: EvalConfig, prestarted: Prestarter, workspace: Path,
            repeats: int, budget: Budget) -> None:
    solution = workdir(config.device, run.work, workspace)
    for _ in range(repeats):
        if budget.spent() and len(run.verdicts) >= 3:
            break
        run.loads.append(current_load())
        verdict = judge(task_path, solution, config, prestarted)
        run.verdicts.append(verdict)
        print(f"  {run.size} {run.name}: verdict {len(run.verdicts)}: reward {verdict.reward}, speed-up "
              f"{verdict.speedup_vs_eager:.4g} (bound {verdict.speedup_vs_eager_lower:.4g}), candidate "
              f"{verdict.candidate_ms:.5g} ms", file=sys.stderr, flush=True)


def summary(run: Run, config: EvalConfig) -> dict:
    """One solution's result: the keys results are read by (``name`` .. ``candidate_ms_cv``), then
    what they were computed from."""
    threshold = MILESTONES.get(config.reward.milestone)
    verdicts = run.verdicts
    times = [v.candidate_ms for v in verdicts]
    vs_eager = statistics.median(v.speedup_vs_eager for v in verdicts)
    compiled = [v.speedup_vs_compile for v in verdicts if v.speedup_vs_compile is not None]
    vs_compile = statistics.median(compiled) if compiled else None
    # The compile milestone can change the reward only once the eager one is earned.
    relevant = [vs_eager] + ([vs_compile] if vs_compile is not None and vs_eager > threshold else [])
    distance = min((s / threshold - 1 for s in relevant), key=abs)
    rewards = [v.reward for v in verdicts]
    cv = statistics.stdev(times) / statistics.fmean(times) if len(times) > 1 else None
    within = statistics.median(v.candidate_timing.median_rel_err for v in verdicts)
    point = [milestone_reward(True, v.speedup_vs_eager, v.speedup_vs_compile, config.reward.milestone)
             for v in verdicts]
    return {
        "name": run.name, "device": config.device, "size": run.size, "speedup_median": vs_eager,
        "threshold_distance": distance, "reward_agreement": _agreement(rewards),
        "candidate_ms_cv": cv,
        "between_verdict_rel_err": (math.sqrt(max(0.0, cv ** 2 - within ** 2)) if cv is not None else None),
        "speedup_vs_compile_median": vs_compile, "work": run.work, "verdicts": len(verdicts), "rewards": rewards,
        "eager_milestone_rate": sum(r >= 2 for r in rewards) / len(rewards),
        "point_estimate_rewards": point, "point_estimate_agreement": _agreement(point),
        "point_estimate_eager_milestone_rate": sum(r >= 2 for r in point) / len(point),
        "candidate_median_rel_err_median": within,
        "candidate_ms": times, "eager_ms": [v.eager_ms for v in verdicts],
        "compile_ms": [v.compile_ms for v in verdicts],
        "speedup_vs_eager": [v.speedup_vs_eager for v in verdicts],
        "speedup_vs_eager_lower": [v.speedup_vs_eager_lower for v in verdicts],
        "speedup_vs_compile_lower": [v.speedup_vs_compile_lower for v in verdicts],
        "candidate_median_rel_err": [v.candidate_timing.median_rel_err for v in verdicts],
        "retimed_near_threshold": sum(any("timed again" in n for n in v.notes) for v in verdicts),
        "baselines_from_cache": sum(all(s == "cache" for s in v.baseline_sources.values()) for v in verdicts),
        "load_per_cpu": run.loads,
        "sm_clock_mhz": [int(v.environment["sm_clock_mhz_timing"]) if "sm_clock_mhz_timing" in v.environment else None
                         for v in verdicts],
        "verdict_s": [v.phase_seconds.get("total") for v in verdicts],
    }


def earlier_sizes(path: Path, device: str, preset: str, sizes: list[str]) -> dict:
    """The sizes and solutions of an earlier run's JSON that ``sizes`` leaves out."""
    earlier = json.loads(path.read_text())
    if (earlier.get("backend"), earlier.get("preset")) != (device, preset):
        raise SystemExit(f"--append: {path} holds a {earlier.get('backend')}/{earlier.get('preset')} run, "
                         f"not {device}/{preset}")
    return {"sizes": {k: v for k, v in earlier["sizes"].items() if k not in sizes},
            "solutions": [s for s in earlier["solutions"] if s["size"] not in sizes]}


def _agreement(rewards: list[int]) -> float:
    """The share of verdicts that got the most common reward."""
    return Counter(rewards).most_common(1)[0][1] / len(rewards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--repeats", type=int, default=20, help="verdicts per solution")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES_MS), default=list(SIZES_MS),
                        help="eager-time sizes to run")
    parser.add_argument("--preset", choices=PRESETS.names(), default="strict", help="evaluation preset of the verdicts")
    parser.add_argument("--time-budget-s", type=float, default=3600.0,
                        help="whole run, shared equally by the sizes left and, within a size, by the solutions "
                             "left after its calibration; a solution stops repeating (after 3) when its share is spent")
    parser.add_argument("--cache-dir", type=Path, default=None, help="build/baseline cache (default: a fresh one)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument("--append", action="store_true",
                        help="keep the sizes of an existing --out file (same device and preset) that this run "
                             "does not measure: one size per call on a machine with a time limit per command")
    parser.add_argument("--drift", type=float, default=None,
                        help="reward.drift of the verdicts (default: the preset's, i.e. the backend's measured figure)")
    parser.add_argument("--smoke", action="store_true",
                        help="CI smoke mode: tiny timing budgets, no torch.compile baseline, two calibration steps "
                             "(numbers meaningless)")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error(f"--repeats must be at least 2 (an agreement needs repeats), got {args.repeats}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA GPU is visible to torch here; use --device cpu")

    budget = Budget(args.time_budget_s)
    workspace = Path(tempfile.mkdtemp(prefix="cuda-agent-bench-reward-"))
    config = EvalConfig.from_dict({"preset": args.preset, "device": args.device,
                                   "cache_dir": str(args.cache_dir or workspace / "cache")})
    if args.drift is not None:
        config = config.replace(reward=replace(config.reward, drift=args.drift))
    if args.smoke:  # and no second look near the threshold
        config = config.replace(timing=SMOKE_TIMING, reward=replace(config.reward, resample_budget_s=0.0))
    details = machine_details()
    result = {"device": device_label(details), "machine": details, "backend": args.device, "preset": args.preset,
              "smoke": args.smoke, "repeats": args.repeats, "threshold": MILESTONES.get(config.reward.milestone),
              "reward_confidence": config.reward.confidence,
              "reward_drift": drift_for(config.reward, config.device),
              "sizes": {}, "solutions": []}
    if args.append and args.out is not None and args.out.exists():
        kept = earlier_sizes(args.out, args.device, args.preset, args.sizes)
        result["sizes"], result["solutions"] = kept["sizes"], kept["solutions"]
    try:
        # Sizes first, in this process, before any worker competes for the cores.
        sizes = {label: size_for(SIZES_MS[label], args.device) for label in args.sizes}
        # As many slots ahead as a stream of verdicts keeps (one, on CUDA, left each verdict
        # waiting ~10 s for the next slot's start).
        with Prestarter(config, default_prestart_slots(args.device)) as prestarted:
            # Size by size, each calibrated just before its verdicts and given an equal share of
            # what is left: a run stopped by its caller keeps whole sizes, not calibrations.
            for done_sizes, (label, (n, took)) in enumerate(sizes.items()):
                size_budget = Budget(budget.left_s() / (len(sizes) - done_sizes))
                task_path = sized_task(n, workspace)
                first, retries = timed_baselines(task_path, took, config, prestarted, workspace)
                works = calibrate(task_path, first, config, prestarted, workspace, steps=2 if args.smoke else 7,
                                  smoke=args.smoke)
                result["sizes"][label] = {"n": n, "eager_ms_here": took, "eager_ms": first.eager_ms,
                                          "compile_ms": first.compile_ms, "baselines_stalled": retries, "work": works}
                for done, (name, work) in enumerate(works.items()):
                    run = Run(name, label, work)
                    measure(run, task_path, config, prestarted, workspace, args.repeats,
                            Budget(size_budget.left_s() / (len(works) - done)))
                    result["solutions"].append(summary(run, config))
                    write_json(result, args.out)  # after every solution: a run stopped by its caller keeps those done
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    print(f"reward stability ({args.device}, {args.preset}): agreement " + ", ".join(
        f"{s['size']} {s['name']} {s['reward_agreement']:.0%} (speed-up {s['speedup_median']:.3g}, "
        f"distance {s['threshold_distance']:+.1%})" for s in result["solutions"]))


if __name__ == "__main__":
    main()

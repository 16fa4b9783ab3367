"""Whether a timing loop needs its warm-up floor (``timing.warmup_ms``, 200 ms) when the GPU was
busy just before it: the question behind ~0.6 s of every self-check verdict's time alone on the GPU.

The floor exists for the clocks: an idle H200 reads 345 MHz and a busy one 1980 MHz, and a loop
started on an idle GPU would time its first calls slow. Every verdict's loops (eager, compile,
candidate) pay it, yet in a check run the GPU is rarely idle: other evaluations' device work holds
it between two measurements. This measures two things on one GPU:

1. **The clock's trace** (``torch.cuda.clock_rate``, read from NVML): idle, then the workload back
   to back until the clock settles, then idle again. ``ramp_ms``: busy time until the clock first
   reads within 5 % of its busy level; ``held_ms``: idle time until it first falls below that.
2. **Loops with the floor and without it** (``timing.measure`` as verdicts run it), each after an
   idle gap (0 .. 3 s), the two orders alternating: the ratio of the medians without the floor to
   those with it, per gap. A ratio within the floor's own spread at the gaps a check leaves (well
   under a second) says the floor can be skipped when the GPU was busy that recently.

    python bench/clock_warmup.py --device cuda --out $OUT/clock_warmup.json
    python bench/clock_warmup.py --device cpu --smoke --out /tmp/cw.json   # CPU smoke: numbers mean nothing
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from benchlib import SMOKE_TIMING, WORKLOADS, machine_details, spread, workload, write_json

from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.device_clock import sm_clock_mhz
from cuda_agent.environment.timing import make_timer, measure

SETTLED = 0.95
"""A clock within this share of its busy level counts as ramped."""


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def clock_trace(fn: Callable[[], Any], device: str, idle_s: float, busy_s: float, decay_s: float) -> dict[str, Any]:
    """Clock readings (ms since the phase began, MHz) idle, busy and idle again, and the ramp and
    hold times read off them (None where the clock cannot be read or never crossed)."""
    time.sleep(idle_s)
    idle = [sm_clock_mhz(device) for _ in range(5)]
    busy, started = [], time.monotonic()
    while time.monotonic() - started < busy_s:
        fn()
        synchronize(device)
        busy.append(((time.monotonic() - started) * 1e3, sm_clock_mhz(device)))
    decay, started = [], time.monotonic()
    while time.monotonic() - started < decay_s:
        decay.append(((time.monotonic() - started) * 1e3, sm_clock_mhz(device)))
        time.sleep(0.005)
    readings = [mhz for _, mhz in busy[len(busy) * 2 // 3:] if mhz is not None]
    level = statistics.median(readings) if readings else None
    ramp = next((t for t, mhz in busy if level and mhz is not None and mhz >= SETTLED * level), None)
    held = next((t for t, mhz in decay if level and mhz is not None and mhz < SETTLED * level), None)
    return {"idle_mhz": idle, "busy_mhz": level, "ramp_ms": ramp, "held_ms": held, "busy_calls": len(busy),
            "busy": busy[:: max(1, len(busy) // 200)], "decay": decay[:: max(1, len(decay) // 200)]}


def floor_loops(fn: Callable[[], Any], device: str, timing: TimingConfig, gaps_s: list[float],
                repeats: int) -> list[dict[str, Any]]:
    """Per idle gap: the medians of loops with the floor and without it, alternating which goes first."""
    timer = make_timer(device, timing)
    without_floor = replace(timing, warmup_ms=0.0)
    rows = []
    for gap in gaps_s:
        runs: dict[str, list] = {"floor": [], "no_floor": []}
        for repeat in range(repeats):
            order = [("floor", timing), ("no_floor", without_floor)]
            for name, config in order if repeat % 2 == 0 else order[::-1]:
                time.sleep(gap)
                stats = measure(fn, timer, config)
                runs[name].append({"median_ms": stats.median_ms, "median_rel_err": stats.median_rel_err,
                                   "n": stats.n, "exhausted": stats.budget_exhausted,
                                   "clock_after_mhz": sm_clock_mhz(device)})
        floor = [r["median_ms"] for r in runs["floor"]]
        no_floor = [r["median_ms"] for r in runs["no_floor"]]
        rows.append({"gap_s": gap, **runs, "no_floor_over_floor": statistics.median(no_floor) / statistics.median(floor),
                     "floor_spread": spread(floor)})
    return rows


def workload_arg(text: str) -> tuple[str, float]:
    name, _, scale = text.partition(":")
    if name not in WORKLOADS:
        raise argparse.ArgumentTypeError(f"workload {name!r} is unknown; valid: {', '.join(sorted(WORKLOADS))}")
    try:
        return name, float(scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"workload {text!r}: the scale after ':' must be a number") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--workloads", nargs="+", type=workload_arg, default=[("matmul", 1.0), ("add", 1 / 256)],
                        help="NAME[:SCALE] (scale 1: ~1-3 ms on an H200; add:0.004 is a µs-scale kernel)")
    parser.add_argument("--gaps", nargs="+", type=float, default=[0.0, 0.25, 1.0, 3.0], help="idle seconds before a loop")
    parser.add_argument("--repeats", type=int, default=4, help="loops of each kind per gap")
    parser.add_argument("--smoke", action="store_true", help="tiny loops and trace: runs end to end, numbers mean nothing")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.repeats < 1 or min(args.gaps) < 0:
        parser.error(f"--repeats must be >= 1 and --gaps >= 0, got {args.repeats} and {args.gaps}")
    timing = replace(SMOKE_TIMING, warmup_ms=20.0) if args.smoke else TimingConfig()
    trace_s = (0.05, 0.1, 0.1) if args.smoke else (3.0, 1.5, 3.0)
    result: dict[str, Any] = {"machine": machine_details(), "device": args.device, "smoke": args.smoke,
                              "warmup_ms": timing.warmup_ms, "workloads": {}}
    for name, scale in args.workloads:
        fn = workload(name, args.device, scale if not args.smoke else scale / 256)
        fn()
        synchronize(args.device)
        result["workloads"][f"{name}:{scale:g}"] = {
            "what": WORKLOADS[name], "trace": clock_trace(fn, args.device, *trace_s),
            "loops": floor_loops(fn, args.device, timing, args.gaps, args.repeats)}
        write_json(result, args.out)  # after every workload: a call stopped at its limit keeps what was done
    print(" ".join(
        f"{key}: ramp {w['trace']['ramp_ms']} ms, held {w['trace']['held_ms']} ms; no floor/floor "
        + ", ".join(f"{row['gap_s']:g}s {row['no_floor_over_floor']:.4f} (±{row['floor_spread']:.2%})" for row in w["loops"])
        for key, w in result["workloads"].items()))


if __name__ == "__main__":
    main()

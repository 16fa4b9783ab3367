"""Whether a worker slot warming up beside a timing loop disturbs it: the question behind the
``slot_warm`` turn.

On a GPU shared by several evaluations, a prestarted slot makes its two CUDA contexts (and loads
the reference's comparison kernels) holding the GPU shared, so that no measurement runs meanwhile.
On one H200's self-check that turn was 1.2 s of every verdict's ~4.8 s of shared holds, which keep
measurements out (docs/gpu-validation.md, 2026-12-01). If slots warming beside a timing loop leave
its median where it is, the turn can go; if they move it, it stays.

This times one fixed workload with the harness's own loop (``timing.measure``: L2 flush, CUDA
events, the precision target and budget of ``TimingConfig``) in passes that alternate: quiet, then
with real worker slots (``WorkerSlot``, started host-only before the pass as the prestarter starts
them) making their device contexts one after another beside it, with no device gate. It reports
each pass's medians, precision and samples, the slots warmed and how much of each busy pass they
covered (``busy_share_warming``: below 1, the later loops ran quiet), and the ratio of the busy
passes' median to the quiet ones' (1.0: no disturbance), with each kind's spread beside it.

    python bench/slot_warm_disturbance.py --device cuda --passes 6 --out $OUT/slot_warm_disturbance.json
    python bench/slot_warm_disturbance.py --device cpu --passes 2 --smoke --out /tmp/swd.json   # CPU smoke
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from benchlib import SMOKE_TIMING, WORKLOADS, machine_details, spread, workload, write_json

from cuda_agent.environment import EvalConfig
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.slots import WorkerSlot
from cuda_agent.environment.timing import make_timer, measure

class SlotWarmUps:
    """Worker slots started before a busy pass (interpreters up, torch imported: host work, no
    device), whose device warm-ups, the work of the ``slot_warm`` turn, run one after another in a
    thread while entered, with no device gate. Closed on exit."""

    def __init__(self, config: EvalConfig, count: int, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self.slots = [WorkerSlot(config, warm_device=False) for _ in range(count)]
        for slot in self.slots:  # the host side is done before the pass begins
            for worker in (slot.reference, slot.candidate):
                worker.wait_background(timeout_s)
        self.warm_s: list[float] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="slot-warm-ups", daemon=True)

    def _run(self) -> None:
        for slot in self.slots:
            try:
                started = time.monotonic()
                slot.warm(self.timeout_s)
                self.warm_s.append(time.monotonic() - started)
            except Exception as exc:  # noqa: BLE001 - reported in the results, the pass goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> "SlotWarmUps":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join()
        for slot in self.slots:
            slot.close()


def timed_pass(fn: Callable[[], Any], device: str, timing: TimingConfig, loops: int) -> dict[str, Any]:
    """``loops`` timing loops back to back (each as a verdict's: warm-up, then to its target or
    budget); their medians and how far each got."""
    timer = make_timer(device, timing)
    stats = [measure(fn, timer, timing if i == 0 else replace(timing, warmup_ms=0.0)) for i in range(loops)]
    return {"median_ms": [s.median_ms for s in stats], "median_rel_err": [s.median_rel_err for s in stats],
            "rel_std_err": [s.rel_std_err for s in stats], "n": [s.n for s in stats],
            "exhausted": sum(s.budget_exhausted for s in stats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=1.0, help="workload size (1: ~1-3 ms on an H200)")
    parser.add_argument("--passes", type=int, default=6, help="pairs of passes (quiet, then busy) per workload")
    parser.add_argument("--loops", type=int, default=8, help="timing loops per pass")
    parser.add_argument("--slots", type=int, default=6, help="slots whose device warm-ups run during a busy pass")
    parser.add_argument("--smoke", action="store_true", help="tiny timing loops: runs end to end, numbers mean nothing")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if min(args.passes, args.loops, args.slots) < 1:
        parser.error(f"--passes, --loops and --slots must be >= 1, got {args.passes}, {args.loops} and {args.slots}")
    timing = SMOKE_TIMING if args.smoke else TimingConfig()
    config = EvalConfig(device=args.device)
    result: dict[str, Any] = {"machine": machine_details(), "device": args.device, "scale": args.scale,
                              "loops_per_pass": args.loops, "smoke": args.smoke, "workloads": {}}
    for name in args.workloads:
        fn = workload(name, args.device, args.scale if not args.smoke else args.scale / 256)
        quiet, busy, warm_s, errors, overlapped = [], [], [], [], []
        for _ in range(args.passes):
            quiet.append(timed_pass(fn, args.device, timing, args.loops))
            with SlotWarmUps(config, args.slots) as warm_ups:
                started = time.monotonic()
                busy.append(timed_pass(fn, args.device, timing, args.loops))
                timed_s = time.monotonic() - started
            overlapped.append(min(1.0, sum(warm_ups.warm_s) / timed_s))  # 1: a warm-up ran beside the whole pass
            warm_s, errors = warm_s + warm_ups.warm_s, errors + warm_ups.errors
        quiet_ms = [m for p in quiet for m in p["median_ms"]]
        busy_ms = [m for p in busy for m in p["median_ms"]]
        result["workloads"][name] = {
            "what": WORKLOADS[name], "quiet": quiet, "busy": busy, "slots_warmed": len(warm_s),
            "median_slot_warm_s": statistics.median(warm_s) if warm_s else None, "errors": errors[:3],
            "busy_share_warming": overlapped,
            "busy_over_quiet": statistics.median(busy_ms) / statistics.median(quiet_ms),
            "quiet_spread": spread(quiet_ms), "busy_spread": spread(busy_ms),
        }
        write_json(result, args.out)  # after every workload: a call stopped at its limit keeps what was done
    print(" ".join(f"{name}: busy/quiet {w['busy_over_quiet']:.4f} (spread quiet {w['quiet_spread']:.2%}, busy "
                   f"{w['busy_spread']:.2%}; {w['slots_warmed']} slots warmed)"
                   for name, w in result["workloads"].items()))


if __name__ == "__main__":
    main()

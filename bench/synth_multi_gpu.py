"""Synthesis on every GPU of a host: accepted tasks per GPU-hour on all GPUs vs one, side by side,
then the full-scale training set (issue 29), one resumable 10-minute command at a time.

The device machine is fresh at every call, so the run's state travels as an archive: a step unpacks
``--state`` (if it exists), runs, and packs the state into ``$OUT`` (``ops-state.tar.gz``, in 15 MiB
parts when larger: ``.part0``, ``.part1``, ...). Copy what comes back to ``--state`` for the next
call and name it (or its parts) in the call's ``carry`` (``runs/`` is git-ignored, so it does not
travel otherwise). The archive holds the run's records only (the
journal, composed tasks, run records, settings and seed catalogue, ~10 MiB for 20,000 seeds); the
data files and the card are written again from them. The state is also packed as the step goes
(each minute, from a batch report), so a call killed at its limit still returns its last minute's
work (without that call's line in the run records, which is written at its end).

On a 4-GPU H100 host (64 cores; a 2-GPU or H200 host runs the same), each step one call:

    python bench/synth_multi_gpu.py measure --state runs/ops-state.tar.gz --out $OUT
    python bench/synth_multi_gpu.py build --state runs/ops-state.tar.gz --out $OUT     # repeat until >= 6,000
Then here, on the CPU machine:

    python bench/synth_multi_gpu.py publish --state runs/ops-state.tar.gz --benchmark KernelBench/KernelBench

``publish`` copies the state archive into the data folder beside the Parquet, so that a later session
continues the run from the repository: ``build --state data/ops-<N>k-<gpu>/ops-state.tar.gz``
(then ``git rm`` the smaller folder the next ``publish`` supersedes). The set's self-check so far
(``checks.parquet``, gathered by ``bench/dataset_check.py``) goes along: from ``--checks``, or from
beside ``--state``. It is applied first (``synth apply-checks``): the tasks whose check did not come
out ``correct`` leave the set, the ``correct`` ones take the check's eager and compile times; the
card counts both.

Expected durations and why:

- ``measure`` (~9.5 min): mining the seed catalogue when the state has none (~15 s on an H100 host),
  then the same dataset grown on one GPU for ``--one-gpu-min`` (4) and on every GPU for
  ``--all-gpus-min`` (4.5), each phase ending ~10-20 s after its limit (finalizing, closing workers);
  packing ~10 s. 4 minutes is the shortest that leaves ~3 minutes of steady state after the first
  worker starts and compiles (on one H100, ~70 accepted a minute: ~200 tasks, a relative standard
  error near 7 %). Both phases run in one command on one machine, so the ratio compares like with
  like; each phase also reports its steady rate (from ``--warmup-s`` on), which leaves out the
  cold start that only the first phase pays. Both phases add their tasks to the set.
- ``build`` (~9.5 min): one phase on every GPU for ``--minutes`` (8.8), plus unpacking and packing.
  At 4 x ~70 accepted a minute, ~2,500 tasks a call: 6,000 take ~3 calls after ``measure``
  (12,000, the aim, ~5).
- ``publish`` (CPU, ~2 min for 12,000 tasks): withdraws KernelBench copies (``--benchmark``; the
  device machine has no KernelBench checkout), writes ``data/ops-<N>k-<gpu>/`` (``<gpu>``: the model
  the run records name, ``h100``, ``h200``, joined when calls ran on both; Parquet, card, PNGs,
  run records, seed catalogue) and the 200-task sample in ``examples/data/``.

Lanes: ``--lanes-per-gpu`` (14) filter workers and ``--composers-per-gpu`` (4) composer processes
per GPU. 14 x 4 GB (the filter's memory bound) + 4 x 3 GB (a composer's sizing cap) fits an 80 GB
H100 with the parent's context; on one H100, 16 lanes kept the measurement lock ~93 % busy.

A CPU smoke run of every step (lane groups ``cpu:0``/``cpu:1`` stand in for GPUs; the numbers mean
nothing): ``python bench/synth_multi_gpu.py measure --device cpu --n 6 --lanes-per-gpu 1
--composers-per-gpu 1 --one-gpu-min 0.5 --all-gpus-min 0.5 --warmup-s 5 --state /tmp/s.tar.gz --out /tmp/o``.
"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import io
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from benchlib import REPO, machine_details, write_json

from cuda_agent.synth.checks import CHECKS
from cuda_agent.synth.composer import DeterministicComposer
from cuda_agent.synth.dataset import COMPOSED, JOURNAL, META, RUNS, DatasetWriter, stats, write_sample
from cuda_agent.synth.devices import lane_devices
from cuda_agent.synth.filter import FilterConfig
from cuda_agent.synth.full_card import make_card
from cuda_agent.synth.mining import load_catalogue, mine_seed_ops, save_catalogue
from cuda_agent.synth.pipeline import RunConfig, RunStatus, apply_checks, decontaminate_dataset, run
from cuda_agent.synth.records import SEED_OPS

STATE_FILES = (META, JOURNAL, COMPOSED, RUNS, SEED_OPS)
"""What the archive keeps: everything else is written again from these."""
PART_BYTES = 15 << 20
"""Largest file that comes back from a device call is 16 MiB: archives are cut into parts below it."""
ARCHIVE = "ops-state.tar.gz"


def unpack(state: Path, work: Path) -> None:
    """Replace ``work`` with the run's state from ``state`` (a file, or its ``.part<k>`` files)."""
    parts = state_parts(state)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if parts:
        data = b"".join(part.read_bytes() for part in parts)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            archive.extractall(work, filter="data")
        print(f"unpacked {len(data) / 2**20:.1f} MiB of state from {len(parts)} file(s) into {work}")


def state_parts(state: Path) -> list[Path]:
    """The archive's files in order: ``state`` itself, or its ``.part<k>`` files (none: a new run)."""
    if state.exists():
        return [state]
    parts = [Path(p) for p in glob.glob(f"{state}.part*")]
    return sorted(parts, key=lambda path: int(path.name.rsplit(".part", 1)[1]))


def pack(work: Path, out: Path) -> list[Path]:
    """Archive ``work``'s records into ``out`` (one file, or parts under :data:`PART_BYTES`).

    Each file is written beside its name and then renamed over it, so a call killed while packing
    leaves the previous archive whole (one file; of parts, each is whole)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        for name in STATE_FILES:
            if (work / name).exists():
                archive.add(work / name, arcname=name)
    data = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    if len(data) <= PART_BYTES:
        written = [out / ARCHIVE]
    else:
        written = [out / f"{ARCHIVE}.part{index}" for index in range((len(data) + PART_BYTES - 1) // PART_BYTES)]
    for index, path in enumerate(written):
        partial = path.with_name(path.name + ".writing")
        partial.write_bytes(data[index * PART_BYTES:(index + 1) * PART_BYTES])
        os.replace(partial, path)
    for stale in set(glob.glob(str(out / f"{ARCHIVE}*"))) - {str(path) for path in written}:
        os.unlink(stale)
    print(f"packed {len(data) / 2**20:.1f} MiB of state into {', '.join(path.name for path in written)}", flush=True)
    return written


class Snapshots:
    """The state packed into ``out`` as a call goes, so that nothing done is lost with the call.

    A call that outlives its device command's limit is killed before ``main`` packs (the third
    build call of 2026-11-29 stopped reporting at 209 s of its 480 and lost all its work): every
    ``every_s`` a batch report packs the state, which is quiet then (the pipeline writes it from
    the thread that reports). And when no batch has come for ``stall_s``, every thread's stack goes
    to stderr (again each ``stall_s``), which says where such a call waits.
    """

    def __init__(self, work: Path, out: Path, every_s: float = 60.0, stall_s: float = 120.0) -> None:
        self.work, self.out, self.every_s, self.stall_s = work, out, every_s, stall_s
        self.packed_at: float | None = None

    def __enter__(self) -> Snapshots:
        faulthandler.dump_traceback_later(self.stall_s, repeat=True)
        return self

    def __exit__(self, *exc: object) -> None:
        faulthandler.cancel_dump_traceback_later()

    def batch(self) -> None:
        """A batch was decided: the stall clock starts again; pack if the last pack is old."""
        faulthandler.dump_traceback_later(self.stall_s, repeat=True)
        now = time.monotonic()
        if self.packed_at is None or now - self.packed_at >= self.every_s:
            pack(self.work, self.out)
            self.packed_at = now


def composer_for(work: Path, device: str) -> DeterministicComposer:
    """The composer over the run's seed catalogue (mined into ``work`` the first time)."""
    path = work / SEED_OPS
    if not path.exists():
        started = time.monotonic()
        save_catalogue(mine_seed_ops(), path)
        print(f"mined {len(load_catalogue(path).ops)} seed operators in {time.monotonic() - started:.0f} s")
    catalogue = load_catalogue(path)
    window = FilterConfig(device=device).window
    return DeterministicComposer(catalogue, target_ms=window, device=device)


def phase(name: str, work: Path, args: argparse.Namespace, gpus: list[str], minutes: float) -> dict[str, Any]:
    """One pipeline call on ``gpus`` for ``minutes``; its counts, rates and progress series."""
    composer = composer_for(work, args.device)
    config = RunConfig(n=args.n, filter=FilterConfig(device=args.device, restart_every=16),
                       workers=args.lanes_per_gpu * len(gpus), compose_workers=args.composers_per_gpu * len(gpus),
                       devices=tuple(gpus), time_limit_s=minutes * 60, batch_size=25,
                       benchmark=args.benchmark)
    series: list[RunStatus] = []
    snapshots = Snapshots(work, args.out)

    def report(status: RunStatus) -> None:
        series.append(status)
        print(f"[{name} {status.elapsed_s:6.0f} s] accepted {status.accepted} of {status.decided}; composed "
              f"{status.composed}/{status.seeds}, queued {status.queued}", flush=True)
        snapshots.batch()

    families = {op.name: op.family for op in composer.catalogue.ops}
    with snapshots:
        numbers = run(config, work, composer, families=families, on_batch=report,
                      command=f"bench/synth_multi_gpu.py {args.step} ({name})")
    this_run = numbers["this_run"]
    seconds, accepted = this_run["seconds"], this_run["accepted"]
    steady = [status for status in series if status.elapsed_s >= args.warmup_s]
    result = {
        "gpus": len(gpus), "devices": gpus, "minutes": minutes, "seconds": seconds,
        "accepted": accepted, "decided": this_run["decided"], "composed": this_run["composed"],
        "accepted_per_hour": accepted * 3600 / seconds, "accepted_per_gpu_hour": accepted * 3600 / seconds / len(gpus),
        "lock_busy": {device: counts.get("lock_s", 0.0) / seconds for device, counts in this_run["per_device"].items()},
        "filter_lane_seconds": this_run["filter_lane_seconds"],
        "series": [[round(s.elapsed_s, 1), s.accepted, s.decided, s.composed] for s in series],
        "set_tasks": numbers["tasks"],
    }
    if len(steady) >= 2:
        first, last = steady[0], steady[-1]
        rate = (last.accepted - first.accepted) * 3600 / (last.elapsed_s - first.elapsed_s)
        result["steady"] = {"from_s": first.elapsed_s, "to_s": last.elapsed_s, "accepted_per_hour": rate,
                            "accepted_per_gpu_hour": rate / len(gpus)}
    print(f"{name}: {accepted} accepted in {seconds:.0f} s on {len(gpus)} device(s): "
          f"{result['accepted_per_gpu_hour']:.0f} per GPU-hour; the set has {numbers['tasks']} tasks")
    return result


def all_gpus(args: argparse.Namespace) -> list[str]:
    if args.device == "cpu":
        return ["cpu:0", "cpu:1"]
    return [device.visible for device in lane_devices("cuda")]


def measure(args: argparse.Namespace, work: Path) -> None:
    gpus = all_gpus(args)
    one = phase("one_gpu", work, args, gpus[:1], args.one_gpu_min)
    every = phase("all_gpus", work, args, gpus, args.all_gpus_min)
    result: dict[str, Any] = {"machine": machine_details(), "order": ["one_gpu", "all_gpus"], "one_gpu": one,
                              "all_gpus": every, "lanes_per_gpu": args.lanes_per_gpu,
                              "composers_per_gpu": args.composers_per_gpu}
    result["speedup_all_vs_one"] = every["accepted_per_hour"] / one["accepted_per_hour"] if one["accepted"] else None
    if "steady" in one and "steady" in every and one["steady"]["accepted_per_hour"]:
        result["steady_speedup_all_vs_one"] = every["steady"]["accepted_per_hour"] / one["steady"]["accepted_per_hour"]
    write_json(result, args.out / f"synth_multi_gpu_{model_slug(result['machine']['gpu'] or 'cpu')}.json")
    print(f"all {len(gpus)} vs one: {result['speedup_all_vs_one']} (steady: {result.get('steady_speedup_all_vs_one')})")


def build(args: argparse.Namespace, work: Path) -> None:
    result = {"machine": machine_details(), "build": phase("build", work, args, all_gpus(args), args.minutes)}
    write_json(result, args.out / f"synth_build_{int(time.time())}.json")


def model_slug(gpu: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``."""
    return gpu.lower().replace("nvidia ", "").split()[0]


def gpu_slug(work: Path) -> str:
    """The GPU models the run's calls filtered on, as a folder-name part (``h100``, ``h100-h200``):
    the eager-time window was measured there, so the set's name says which card it fits."""
    records = [json.loads(line) for line in (work / RUNS).read_text().splitlines() if line.strip()]
    models = {model_slug(gpu) for record in records for gpu in record["machine"]["gpus"]}
    return "-".join(sorted(models)) or "cpu"


def publish(args: argparse.Namespace, work: Path) -> None:
    if args.checks is not None and not args.checks.is_file():
        sys.exit(f"--checks {args.checks}: no such file (expected a {CHECKS} written by bench/dataset_check.py merge)")
    checks = args.checks or args.state.parent / CHECKS  # the set's self-check so far stays with it
    checks_data = checks.read_bytes() if checks.is_file() else None  # read first: it may lie in the target
    catalogue = load_catalogue(work / SEED_OPS)
    if args.benchmark is not None:
        numbers = decontaminate_dataset(work, args.benchmark)
        print(f"withdrew {numbers['withdrawn']} KernelBench copies")
    else:
        with DatasetWriter.reopen(work) as writer:
            writer.finalize({op.name: op.family for op in catalogue.ops})
    if checks_data is not None:
        numbers = apply_checks(work, checks)
        print(f"self-check ({checks}): withdrew {numbers['withdrawn']} tasks that did not come out correct, "
              f"new times for {numbers['retimed']}")
    (work / "tasks.jsonl").unlink(missing_ok=True)  # the published set is Parquet only (its card says which files)
    tasks = stats(work)["tasks"]
    name = args.name or f"ops-{tasks // 1000}k-{gpu_slug(work)}"
    target = REPO / "data" / name
    target.mkdir(parents=True, exist_ok=True)
    for file in ("tasks.parquet", META, RUNS, SEED_OPS):
        shutil.copy2(work / file, target / file)
    # The state travels with the set, so that a later session continues this run from the repository
    # (runs/ is not kept): `build --state data/<name>/ops-state.tar.gz`.
    parts = [part.read_bytes() for part in state_parts(args.state)]  # read first: it may lie in target
    for stale in glob.glob(str(target / f"{ARCHIVE}*")):
        os.unlink(stale)
    for index, data in enumerate(parts):
        (target / (ARCHIVE if len(parts) == 1 else f"{ARCHIVE}.part{index}")).write_bytes(data)
    if checks_data is not None:
        (target / CHECKS).write_bytes(checks_data)
    make_card(work, target / "README.md", benchmark=args.benchmark,
              checks=target / CHECKS if (target / CHECKS).is_file() else None)
    write_sample(target, min(200, tasks), REPO / "examples" / "data" / f"{name}-sample")
    print(f"published {tasks} tasks in {target} and a {min(200, tasks)}-task sample in examples/data/{name}-sample")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("measure", "build", "publish"))
    parser.add_argument("--state", type=Path, default=REPO / "runs" / ARCHIVE, help="the run's state archive")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the run's directory is unpacked (default: /tmp/ops-run; runs/ops "
                             "for publish)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "synth-multi-gpu-out")))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--n", type=int, default=22_000, help="composer seeds (~55 %% become tasks: 12,000)")
    parser.add_argument("--lanes-per-gpu", type=int, default=14)
    parser.add_argument("--composers-per-gpu", type=int, default=4)
    parser.add_argument("--one-gpu-min", type=float, default=4.0)
    parser.add_argument("--all-gpus-min", type=float, default=4.5)
    parser.add_argument("--minutes", type=float, default=8.8, help="build: the call's time limit")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="steady rates count from here")
    parser.add_argument("--benchmark", type=Path, default=None, help="KernelBench/KernelBench, where it is present")
    parser.add_argument("--name", default=None, help="publish: the data folder's name (default: ops-<N>k-<gpu>)")
    parser.add_argument("--checks", type=Path, default=None,
                        help=f"publish: the set's {CHECKS} (default: the one beside --state, if any)")
    args = parser.parse_args()
    work = args.work or (REPO / "runs" / "ops" if args.step == "publish" else Path("/tmp/ops-run"))
    unpack(args.state, work)
    if args.step == "publish":
        publish(args, work)
        return
    try:
        if args.step == "measure":
            measure(args, work)
        else:
            build(args, work)
    finally:
        pack(work, args.out)


if __name__ == "__main__":
    sys.exit(main())

"""A synthesised set's self-check in pieces: ``tasks check`` over the tasks not checked yet, for as
long as a call lasts, and the rows it leaves gathered into the set's ``checks.parquet``.

A set of thousands of tasks is more verdicts than one GPU call holds (one H200 judges ~10 tasks a
minute with three lanes; 6,000 tasks are ~10 GPU-hours). Each call checks a random sample of the
tasks still without a check (``--seed``), stops cleanly at ``--minutes`` (SIGTERM: the run keeps
what it stored), and writes its rows as JSON lines; ``merge`` adds them to the data folder, where
``synth_multi_gpu.py publish`` and ``cuda-agent synth card --checks`` read them.

    # on the GPU machine (the data folder travels with the working tree)
    python bench/dataset_check.py run --data data/ops-6k-h200 --minutes 8.5 --out $OUT
    # here, with the rows it returned
    python bench/dataset_check.py merge --data data/ops-6k-h200 checks_*.jsonl
    # a second call before the first's rows are merged: the same seed from the other end
    python bench/dataset_check.py run --data data/ops-6k-h200 --minutes 8.5 --reverse --out $OUT
    # a check made under conditions since fixed: judged again by a later run (--first: before the rest)
    python bench/dataset_check.py forget --data data/ops-6k-h200 ecfc34a1085db432
    python bench/dataset_check.py run --data data/ops-6k-h200 --first ecfc34a1085db432 --out $OUT
    # a set that must be checked on one GPU model: once the unchecked are done, the rest on it
    python bench/dataset_check.py run --data data/ops-6k-h200 --on H100 --out $OUT

``run`` writes ``checks_<time>.jsonl`` (one row per task it judged: status, error, the four baseline
medians, sizes, verdict seconds, GPU) and ``dataset_check_<time>.json`` (the tasks-check summary:
counts, tasks a minute, median phases, on a shared GPU the medians of the verdicts' turns on it
and the share of the wall time they held it alone (``device_held``), each GPU's timeline (held
alone, shared, unheld: ``bench/gpu_timeline.py``), the share of the baseline
loops that ran out of budget and of the loops' seconds they took, how busy the CPUs were, and
``--compile-threads``), and ``verdicts_<time>.jsonl`` (each verdict's phases, turns on the GPU,
baseline loops with each timing loop's samples and precision, lane and when
it finished, with whether its workers were prestarted and the CPUs they ran on: where a slow run's
time went), and ``tasks_check_<time>.log`` (its stderr: the pool's warnings, e.g. a job tried again
after an infrastructure fault, which leaves no row until it has a verdict).
A task whose check says nothing about it (``infra_error``, ``harness_error``, e.g. the tasks the
stop interrupted) is checked again by a later call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from benchlib import (Budget, check_medians, check_rates, device_held, json_lines, machine_details, tasks_check,
                      write_json)
from gpu_timeline import gpu_timeline

from cuda_agent.synth import checks


def write_slice(data: Path, seed: int, folder: Path, reverse: bool = False,
                first: Sequence[str] = (), on: str | None = None) -> tuple[Path, int]:
    """The set's tasks without a check, then with ``on`` those checked on other GPU models, in
    ``seed``'s order (from its end with ``reverse``) after those of ``first`` (e.g. tasks forgotten
    after a fix, to see it hold), as a Parquet of the set's own columns; and how many there are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(data / "tasks.parquet")
    left = checks.to_check(table.column("id").to_pylist(), checks.read(data / checks.CHECKS), seed, on)
    if reverse:
        left.reverse()
    stray = sorted(set(first) - set(left))
    if stray:
        raise SystemExit(f"--first: {', '.join(stray)} not among the {len(left)} tasks of {data} left to check")
    ahead = dict.fromkeys(first)
    left = [*ahead, *(task for task in left if task not in ahead)]
    position = {task: index for index, task in enumerate(table.column("id").to_pylist())}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tasks.parquet"
    pq.write_table(table.take(pa.array([position[task] for task in left], type=pa.int64())), path)
    return path, len(left)


def run(args: argparse.Namespace) -> None:
    budget = Budget(args.minutes * 60)
    stamp = int(time.time())
    work = args.work / str(stamp)
    tasks, left = write_slice(args.data, args.seed, work / "slice", args.reverse, args.first, args.on)
    scope = "without a check" + (f" or checked on a GPU other than {args.on!r}" if args.on else "")
    print(f"{left} tasks of {args.data} {scope}; checking for {args.minutes:g} minutes", flush=True)
    if not left:
        return
    run_dir = work / "check"
    threads = {} if args.compile_threads == "default" else {"TORCHINDUCTOR_COMPILE_THREADS": args.compile_threads}
    slots = [] if args.prestart_slots is None else ["--prestart-slots", str(args.prestart_slots)]
    args.out.mkdir(parents=True, exist_ok=True)
    entry = tasks_check(tasks, ["--lanes-per-gpu", str(args.lanes_per_gpu), *slots], run_dir, budget, args.gpus,
                        args.work / "cache", threads, log=args.out / f"tasks_check_{stamp}.log")
    if entry["returncode"] == 2:  # bad usage: nothing ran
        sys.exit(f"tasks check refused the run:\n{entry['stderr_tail']}")
    rows = checks.rows_from_store(run_dir) if run_dir.exists() else []
    (args.out / f"checks_{stamp}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (args.out / f"verdicts_{stamp}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in entry["problems"]))
    judged = sum(row["status"] not in checks.RETRIED for row in rows)
    summary: dict[str, Any] = {
        "machine": machine_details(), "data": str(args.data), "lanes_per_gpu": args.lanes_per_gpu,
        "prestart_slots": args.prestart_slots,
        "left_before": left, "judged": judged, "counts": entry["counts"], "wall_s": entry["wall_s"],
        "returncode": entry["returncode"], **check_rates(entry), **check_medians(entry["problems"]),
        "device_held": device_held(entry), "gpu_timeline": gpu_timeline(entry["problems"]), "cpu_busy": entry["cpu_busy"],
        "compile_threads": args.compile_threads,
    }
    write_json(summary, args.out / f"dataset_check_{stamp}.json")
    print(f"judged {judged} ({entry['counts']}) in {entry['wall_s']:.0f} s: "
          f"{summary['tasks_per_min'] or 0:.1f} tasks a minute", flush=True)


def merge(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    for path in args.rows:
        for number, row in json_lines(path):
            missing = [column for column in ("task", "status", "checked_at") if column not in row]
            if missing:
                sys.exit(f"{path}:{number}: a check row needs {', '.join(missing)}")
            rows.append(row)
    numbers = checks.merge(args.data / checks.CHECKS, rows)
    statuses = dict(Counter(row["status"] for row in checks.read(args.data / checks.CHECKS).values()))
    print(f"{args.data / checks.CHECKS}: {numbers['added']} added, {numbers['replaced']} replaced; "
          f"{numbers['rows']} tasks checked: {statuses}")


def forget(args: argparse.Namespace) -> None:
    removed = checks.forget(args.data / checks.CHECKS, args.tasks)
    unknown = sorted(set(args.tasks) - set(removed))
    print(f"{args.data / checks.CHECKS}: {len(removed)} checks removed ({', '.join(removed) or 'none'}); "
          f"the next run checks them again" + (f"; no check held for {', '.join(unknown)}" if unknown else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    check = steps.add_parser("run", help="check tasks without a check, for --minutes")
    check.add_argument("--data", type=Path, required=True, help="the data folder (tasks.parquet, checks.parquet)")
    check.add_argument("--minutes", type=float, default=8.5)
    check.add_argument("--lanes-per-gpu", type=int, default=5,
                       help="evaluations sharing each GPU (5: on an H200 with 16 cores, 11 tasks a minute against "
                            "10 with 3; past that the GPU's turns are the limit)")
    check.add_argument("--prestart-slots", type=int, default=None,
                       help="worker slots each lane keeps warm ahead (tasks check --prestart-slots; default: the "
                            "pool's, one a lane at five lanes)")
    check.add_argument("--compile-threads", default="1",
                       help="inductor code-generation processes per reference worker (TORCHINDUCTOR_COMPILE_THREADS; "
                            "'default': one per core). 1: a verdict's few kernels compile in its own process "
                            "instead of a pool started per worker")
    check.add_argument("--gpus", default=None, help="GPUs to use, e.g. 0,1 (default: all visible)")
    check.add_argument("--seed", type=int, default=0, help="the order the unchecked tasks are taken in")
    check.add_argument("--reverse", action="store_true",
                       help="take the tasks from the end of --seed's order: a second run (on other GPUs of the host, or "
                            "a later call before the first's rows are merged) judges other tasks than one going "
                            "forward")
    check.add_argument("--first", nargs="+", default=[], metavar="TASK",
                       help="unchecked tasks to judge before the rest, in this order (e.g. those forgotten after a "
                            "fix, to see it hold)")
    check.add_argument("--on", default=None, metavar="GPU",
                       help="part of a GPU model's name (e.g. H100): after the unchecked tasks, check again those "
                            "whose check ran on another model (merge then replaces their rows)")
    check.add_argument("--work", type=Path, default=Path("/tmp/dataset-check"))
    check.add_argument("--out", type=Path, required=True, help="where the rows and the summary are written")
    gather = steps.add_parser("merge", help="add a run's rows to the data folder's checks.parquet")
    gather.add_argument("--data", type=Path, required=True)
    gather.add_argument("rows", type=Path, nargs="+", help="checks_*.jsonl files written by run")
    again = steps.add_parser("forget", help="remove the checks of the named tasks, so the next run judges them again")
    again.add_argument("--data", type=Path, required=True)
    again.add_argument("tasks", nargs="+", help="task ids")
    args = parser.parse_args()
    if args.step == "run" and not (args.compile_threads == "default" or args.compile_threads.isdigit()
                                   and int(args.compile_threads) >= 1):
        parser.error(f"--compile-threads: expected 'default' or a count >= 1, got {args.compile_threads!r}")
    if not (args.data / "tasks.parquet").is_file():
        parser.error(f"--data {args.data}: no tasks.parquet there (expected a published data folder)")
    {"run": run, "merge": merge, "forget": forget}[args.step](args)


if __name__ == "__main__":
    main()

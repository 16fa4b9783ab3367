"""GPU validation of the benchmark evaluation, the pools and the service (issue 7).

Runs the user-facing commands as subprocesses, each in its own run folder under ``--out``:

- ``samples``: ``cuda-agent eval`` of the bundled CUDA samples (``examples/solutions/cuda``, and
  the workdir layout, where 4 of 6 tasks have no solution and count as failed);
- ``redteam``: the red-team CUDA variants (``tests/redteam/cuda``) on their task: all must fail;
- ``throughput``: ``--repeats`` copies of every sample task, warm (builds and baselines cached:
  the GPU-bound rate; single-file solutions, and the workdir layout's relu and rmsnorm) and cold
  (every candidate's sources distinct: the compile-bound rate);
- ``service``: ``cuda-agent serve`` on loopback, then ``cuda-agent eval --backend service`` of the
  samples and of the warm throughput set.

Every run uses all visible GPUs (one worker each) and reports evaluations per worker. Writes
``report.html`` + ``summary.md`` per run, ``<out>/gpu-validation-summary.md`` (to commit under
docs/) and ``bench/results/eval_throughput_<device>.json``; steps may run in separate invocations
into the same ``--out`` (the summary keeps every step's rows).

    python bench/eval_gpu_validation.py --out runs/gpu-validation
    python bench/eval_gpu_validation.py --out runs/gpu-validation --steps throughput --repeats 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
REDTEAM = REPO / "tests" / "redteam"
STEPS = ("samples", "redteam", "throughput", "service")


def cli(args: list[str], env: dict[str, str], timeout_s: float = 3600) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], env=env, capture_output=True, text=True,
                            timeout=timeout_s)
    return result, time.monotonic() - started


def run_eval(name: str, tasks: Path, solutions: Path, out: Path, env: dict[str, str], common: list[str],
             extra: list[str] = ()) -> dict:
    """``cuda-agent eval --json`` into a fresh ``out/name``, then ``cuda-agent report``; a summary row."""
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)  # measure every evaluation, never a resumed run
    result, wall_s = cli(["eval", "--tasks", str(tasks), "--solutions", str(solutions), "--out", str(run_dir), "--json",
                          *common, *extra], env)
    if result.returncode not in (0, 1):
        raise SystemExit(f"{name}: cuda-agent eval failed ({result.returncode}):\n{result.stderr[-4000:]}")
    metrics = json.loads(result.stdout)
    report, _ = cli(["report", str(run_dir)], env)
    if report.returncode != 0:
        raise SystemExit(f"{name}: cuda-agent report failed:\n{report.stderr[-2000:]}")
    with sqlite3.connect(run_dir / "results.sqlite") as db:
        workers = dict(db.execute("SELECT worker, COUNT(*) FROM results WHERE worker IS NOT NULL GROUP BY worker"))
    evaluated = sum(workers.values())
    lanes = max(1, len(workers))
    print(f"{name}: {metrics['overall']['n_tasks']} tasks, pass rate {metrics['overall']['pass_rate']:.3f}, "
          f"{evaluated} evaluations in {wall_s:.1f} s on {workers}", flush=True)
    return {"run": name, "wall_s": wall_s, "evaluations": evaluated, "workers": workers,
            "evaluations_per_gpu_hour": evaluated / (wall_s / 3600) / lanes if evaluated else None,
            "overall": metrics["overall"], "levels": {k: v for k, v in metrics.items() if k not in ("overall", "run")}}


def redteam_set(root: Path) -> tuple[Path, Path]:
    """One task per red-team CUDA variant (the relu task each attacks), solutions named after it."""
    tasks, solutions = root / "tasks", root / "solutions"
    for folder in (tasks, solutions):
        folder.mkdir(parents=True, exist_ok=True)
    for variant in sorted((REDTEAM / "cuda").glob("*.py")):
        shutil.copy(REDTEAM / "fixtures" / "tasks" / "relu.py", tasks / f"{variant.stem}.py")
        shutil.copy(variant, solutions / f"{variant.stem}.py")
    return tasks, solutions


def repeated_set(root: Path, examples: Path, solutions_of: Path, repeats: int,
                 distinct_sources: bool) -> tuple[Path, Path]:
    """``repeats`` copies of every sample task. Each solution is ``<task>_r<i>/model_new.py``: with
    identical sources every copy shares one build; with ``distinct_sources`` each gets a comment of
    its own, so each is a fresh compile (what an RL trainer sends)."""
    tasks, solutions = root / "tasks", root / "solutions"
    for folder in (tasks, solutions):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for task in sorted((examples / "tasks").glob("*.py")):
        single, workdir = solutions_of / task.name, solutions_of / task.stem
        if not single.is_file() and not workdir.is_dir():
            continue
        for index in range(repeats):
            key = f"{task.stem}_r{index}"
            shutil.copy(task, tasks / f"{key}.py")
            if workdir.is_dir():
                shutil.copytree(workdir, solutions / key)
                edited = next((solutions / key / "kernels").glob("*_binding.cpp"))
                mark = f"\n// distinct candidate {key} {time.time_ns()}\n"
            else:
                (solutions / key).mkdir()
                shutil.copy(single, solutions / key / "model_new.py")
                edited, mark = solutions / key / "model_new.py", f"\n# distinct candidate {key} {time.time_ns()}\n"
            if distinct_sources:
                edited.write_text(edited.read_text() + mark)
    return tasks, solutions


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def through_service(out: Path, env: dict[str, str], common: list[str], sets: dict[str, tuple[Path, Path]]) -> list[dict]:
    port = free_port()
    log = open(out / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "cuda_agent.cli", "serve", "--port", str(port), "--allow-anonymous",
                               "--state-dir", str(out / "serve-state"), *common], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    rows = []
    try:
        import httpx

        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the service did not start; see {out / 'serve.log'}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        for name, (tasks, solutions) in sets.items():
            rows.append(run_eval(f"service-{name}", tasks, solutions, out, env, [],
                                 ["--backend", "service", "--address", f"http://127.0.0.1:{port}"]))
        metrics = httpx.get(f"http://127.0.0.1:{port}/v1/metrics", timeout=30).json()
        (out / "service-metrics.json").write_text(json.dumps(metrics, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=300)
        log.close()
    return rows


def merged_rows(path: Path, rows: list[dict]) -> list[dict]:
    """This invocation's rows over those of earlier invocations into the same ``--out`` (steps can
    run one at a time, e.g. within a time limit per command); a rerun step replaces its rows."""
    earlier = json.loads(path.read_text()) if path.is_file() else []
    fresh = {row["run"] for row in rows}
    merged = [row for row in earlier if row["run"] not in fresh] + rows
    path.write_text(json.dumps(merged, indent=1))
    return merged


def machine() -> dict[str, str]:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "gpus": str(torch.cuda.device_count())}
    try:
        info["nvidia-smi"] = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=30).stdout.strip()
    except OSError:
        info["nvidia-smi"] = "unavailable"
    return info


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _x(value) -> str:
    return "—" if value is None else f"{value:.3f}x"


def summary_markdown(info: dict[str, str], rows: list[dict], out: Path) -> str:
    lines = ["# Evaluation, pools and service on the GPU (issue 7)", "",
             f"Machine: {info.get('nvidia-smi')}; torch {info['torch']}, CUDA {info['cuda']}, Python {info['python']}.",
             "", "Command: `python bench/eval_gpu_validation.py` (runs `cuda-agent eval`, `cuda-agent report` and "
             "`cuda-agent serve` as subprocesses).", "",
             "| run | tasks | pass | faster vs eager | faster vs compile | geomean vs eager | geomean vs compile "
             "| evaluations per worker | wall s | evaluations / GPU-hour |", "|" + "---|" * 10]
    for row in rows:
        o = row["overall"]
        workers = ", ".join(f"{k}: {v}" for k, v in sorted(row["workers"].items())) or "—"
        rate = row["evaluations_per_gpu_hour"]
        lines.append(f"| {row['run']} | {o['n_tasks']} | {_pct(o['pass_rate'])} | {_pct(o['faster_rate_vs_eager'])} | "
                     f"{_pct(o['faster_rate_vs_compile'])} | {_x(o['geomean_speedup_vs_eager'])} | "
                     f"{_x(o['geomean_speedup_vs_compile'])} | {workers} | {row['wall_s']:.1f} | "
                     f"{'—' if rate is None else f'{rate:.0f}'} |")
    lines += ["", "Evaluations per GPU-hour = evaluations / wall hours / GPUs used (wall time of the whole "
              "command, including start-up; cold runs include every compile).", ""]
    samples = out / "samples" / "summary.md"
    if samples.is_file():
        lines += ["## Samples run (`cuda-agent report`)", "", *samples.read_text().splitlines()[1:]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-validation"))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {', '.join(STEPS)}")
    parser.add_argument("--repeats", type=int, default=5, help="copies of each sample task in the warm throughput set")
    parser.add_argument("--cold-repeats", type=int, default=2, help="copies with distinct sources (fresh compiles)")
    parser.add_argument("--config", type=Path, default=None, help="YAML evaluation config (default: defaults)")
    parser.add_argument("--examples", type=Path, default=EXAMPLES,
                        help="samples folder with tasks/ and solutions/<device>[_workdir]/ (default: the bundled ones)")
    args = parser.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; valid: {', '.join(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    common = ["--device", args.device, *(["--config", str(args.config)] if args.config else [])]
    if args.device == "cuda" and args.config is None:
        import torch

        config = args.out / "arch.yaml"
        config.write_text("build:\n  cuda_arch: '%d.%d'\n" % torch.cuda.get_device_capability())
        common += ["--config", str(config)]
    examples = args.examples.resolve()
    solutions, workdirs = examples / "solutions" / args.device, examples / "solutions" / f"{args.device}_workdir"
    rows: list[dict] = []
    if "samples" in steps:
        rows.append(run_eval("samples", examples / "tasks", solutions, args.out, env, common))
        rows.append(run_eval("samples-workdir", examples / "tasks", workdirs, args.out, env, common))
    if "redteam" in steps:
        rows.append(run_eval("redteam-cuda", *redteam_set(args.out / "sets" / "redteam"), args.out, env, common))
    warm = repeated_set(args.out / "sets" / "warm", examples, solutions, args.repeats, distinct_sources=False)
    if "throughput" in steps:
        rows.append(run_eval("throughput-warm", *warm, args.out, env, common))
        warm_workdir = repeated_set(args.out / "sets" / "warm-workdir", examples, workdirs, args.repeats,
                                    distinct_sources=False)
        rows.append(run_eval("throughput-warm-workdir", *warm_workdir, args.out, env, common))
        cold = repeated_set(args.out / "sets" / "cold", examples, solutions, args.cold_repeats, distinct_sources=True)
        rows.append(run_eval("throughput-cold", *cold, args.out, env, common))
    if "service" in steps:
        rows += through_service(args.out, env, common, {"samples": (examples / "tasks", solutions), "warm": warm})
    info = machine()
    rows = merged_rows(args.out / "rows.json", rows)
    summary = summary_markdown(info, rows, args.out)
    (args.out / "gpu-validation-summary.md").write_text(summary)
    results = REPO / "bench" / "results" / f"eval_throughput_{args.device}.json"
    results.write_text(json.dumps({"machine": info, "runs": rows}, indent=1))
    print(summary)
    print(f"wrote {args.out / 'gpu-validation-summary.md'} and {results}")


if __name__ == "__main__":
    main()

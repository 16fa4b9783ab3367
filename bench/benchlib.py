"""Shared by the bench scripts: machine details, distinct candidate variants, time budgets, JSON.

Every script prints one summary line and writes a JSON object that starts with ``machine`` (and,
for GPU runs, ``device``); ``bench/merge.py`` combines several into one.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import secrets
import statistics
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from cuda_agent.environment import TimingConfig, load_tasks
from cuda_agent.environment.timed_cpus import thread_siblings

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
KERNEL_SOURCE = re.compile(r'^(cuda_source|cpp_source)\s*=\s*r?"""', re.MULTILINE)
SMOKE_TIMING = TimingConfig(budget_s=0.3, min_samples=3, warmup_calls=1, warmup_ms=0, compile_baseline=False)
"""``--smoke``: the pipeline runs end to end, but the numbers mean nothing."""


WORKLOADS = {
    # name: what it is (made by :func:`workload`; ~1-3 ms on an H200 at scale 1)
    "matmul": "fp32 matmul, TF32 off (compute-bound)",
    "add": "elementwise add of two fp32 tensors (memory-bound)",
}


def workload(name: str, device: str, scale: float) -> Callable[[], Any]:
    """A fixed GPU workload to time with the harness's loop (``WORKLOADS``), sized by ``scale``."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    if name == "matmul":
        n = max(16, int(4096 * scale))
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        return lambda: a @ b
    n = max(256, int(2**28 * scale))
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    return lambda: x + y


def spread(medians_ms: list[float]) -> float:
    """Timing loops' range relative to their median: a ratio between two kinds of loop within the
    spread of one kind is no difference."""
    return (max(medians_ms) - min(medians_ms)) / statistics.median(medians_ms)


def machine_details() -> dict[str, Any]:
    """Host, CPU, GPU and software versions: what absolute numbers depend on."""
    import torch

    details: dict[str, Any] = {
        "host": platform.node(), "machine": platform.machine(), "cpu": _cpu_model(), "cpu_cores": os.cpu_count(),
        "threads_per_core": len(thread_siblings(0)),  # a lane's timed CPU keeps its siblings free too
        "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpu": None, "gpu_count": 0, "driver": None,
        "nvcc": _first_line(["nvcc", "--version"], last=True), "cxx": _first_line(["c++", "--version"]),
    }
    if torch.cuda.is_available():
        details.update(gpu=torch.cuda.get_device_name(), gpu_count=torch.cuda.device_count(),
                       driver=_first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
    return details


def device_label(details: dict[str, Any]) -> str:
    return details["gpu"] or f"cpu: {details['cpu']} ({details['cpu_cores']} cores)"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _first_line(command: list[str], last: bool = False) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        lines = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return (lines[-1] if last else lines[0]) if lines else None


CONTRACTS = ("single", "binding", "launcher")
"""How a solution binds its kernels: a single file's ``load_inline``, a workdir with
``*_binding.cpp`` torch glue, a workdir in the fast contract (launchers and the harness's shim)."""


def sample_solution(device: str, task: str, contract: str) -> Path:
    """A bundled honest solution (the path may not exist: no such sample):
    ``examples/solutions/<device>/<task>.py`` (``single``); ``<device>_workdir/<task>`` in the
    contract it uses; ``<device>_workdir_binding/<task>``, the binding-contract counterpart of a
    fast-contract sample."""
    if contract == "single":
        return EXAMPLES / "solutions" / device / f"{task}.py"
    workdir = EXAMPLES / "solutions" / f"{device}_workdir" / task
    workdir_contract = "binding" if any(workdir.glob("kernels/*_binding.cpp")) else "launcher"
    if contract == workdir_contract:
        return workdir
    return EXAMPLES / "solutions" / f"{device}_workdir_{contract}" / task


RUN_ID = secrets.token_hex(4)
"""Part of every variant's sources: variants of one run, or of two runs on one cache, never match."""


def make_variant(solution: Path, index: int, workspace: Path) -> Path:
    """A copy of ``solution`` in which every compiled source differs from every other variant's
    (a distinct constant in each translation unit), so neither the build cache nor the object
    cache can serve it; the kernels compute the same thing. Extension names get the index too,
    so a harness keyed by name (torch's JIT builder) cannot reuse a build either."""
    marker = f"static constexpr int cuda_agent_bench_variant_{RUN_ID}_{index} = {index};\n"
    if solution.is_file():
        target = workspace / f"{solution.stem}_v{index}.py"
        text = KERNEL_SOURCE.sub(lambda m: m.group(0) + "\n" + marker, solution.read_text())
        text = re.sub(r'name="([A-Za-z0-9_]+)"', rf'name="\g<1>_v{index}"', text)
        target.write_text(text)
        return target
    target = workspace / f"{solution.name}_v{index}"
    shutil.copytree(solution, target)
    for source in sorted(target.glob("kernels/*")):
        if source.suffix in (".cu", ".cpp", ".cc"):
            source.write_text(source.read_text() + "\n" + marker)
    return target


class Budget:
    """A wall-clock budget for a whole script: loops stop starting new work once it is spent."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, time.monotonic()

    def left_s(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def spent(self) -> bool:
        return self.left_s() <= 0


def json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for each row of a JSON-lines file the bench scripts wrote (blank lines
    skipped); exits naming the file and line of one that is not JSON."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            sys.exit(f"{path}:{number}: not a JSON line ({exc.msg})")


def write_json(result: dict[str, Any], out: Path | None) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``cuda-agent ARGS`` in a fresh process of this interpreter, with ``env`` on top of ours."""
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env})


def cli_verify(task: Path, solution: Path, device: str, env: dict[str, str], *extra: str) -> tuple[float, dict]:
    """Wall seconds of ``cuda-agent verify TASK SOLUTION --json [extra]`` in a fresh process, and its
    JSON verdict (its ``phase_seconds`` say where the time went inside the command)."""
    started = time.perf_counter()
    result = cli("verify", str(task), str(solution), "--device", device, "--json", *extra, env=env)
    elapsed = time.perf_counter() - started
    verdict = json.loads(result.stdout or "{}") if result.returncode == 0 else {}
    if not verdict.get("correct") or "warning" in result.stderr:
        raise SystemExit(f"cuda-agent verify failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return elapsed, verdict


def cli_keep_warm(task: Path, solution: Path, device: str, env: dict[str, str], runs: int,
                  think_s: float) -> list[tuple[float, dict]]:
    """``runs + 1`` calls of ``cuda-agent verify --keep-warm`` (the first starts the evaluator),
    ``think_s`` apart; the evaluator is stopped after."""
    try:
        calls = []
        for run in range(runs + 1):
            if run:
                time.sleep(think_s)
            calls.append(cli_verify(task, solution, device, env, "--keep-warm"))
        return calls
    finally:
        cli("warm", "stop", env=env)


def median(values: list[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def median_phases(phase_seconds: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Median seconds per phase over evaluations' ``phase_seconds`` (over those that report the
    phase), phases in the order they ran: where a typical evaluation's time goes."""
    phases = dict.fromkeys(phase for seconds in phase_seconds for phase in seconds)
    return {phase: median([s[phase] for s in phase_seconds if s.get(phase) is not None]) for phase in phases}


class CpuBusy:
    """The host's CPUs over a stretch of work: the busy share (not idle, not waiting for I/O) of
    all cores, read from ``/proc/stat`` every ``every_s``; whether a run is bound by its cores.
    Where there is no ``/proc/stat``, :meth:`summary` is None."""

    def __init__(self, every_s: float = 2.0) -> None:
        import threading

        self.every_s, self.shares = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _times() -> tuple[int, int] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except OSError:
            return None
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    def _sample(self) -> None:
        last = self._times()
        while last is not None and not self._stop.wait(self.every_s):
            now = self._times()
            if now is None or now[0] == last[0]:
                continue
            self.shares.append(1 - (now[1] - last[1]) / (now[0] - last[0]))
            last = now

    def __enter__(self) -> "CpuBusy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float] | None:
        """The mean busy share, its 90th percentile, and how many samples they are over."""
        if not self.shares:
            return None
        ordered = sorted(self.shares)
        return {"mean": sum(ordered) / len(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))],
                "samples": len(ordered), "cores": os.cpu_count()}


def tasks_check(tasks: Path, extra: list[str], out_dir: Path, budget: Budget, gpus: str | None,
                cache_dir: Path, env: dict[str, str] | None = None, log: Path | None = None) -> dict[str, Any]:
    """``cuda-agent tasks check`` in a subprocess until done or out of budget (it resumes), with
    ``env`` on top of this process's environment; ``cpu_busy`` is :class:`CpuBusy` over the run.
    ``log``: where its whole stderr goes (the pool's warnings: a job retried after an
    infrastructure fault, a lane restarted), also when it succeeded."""
    started = time.monotonic()
    command = [sys.executable, "-m", "cuda_agent.cli", "tasks", "check", str(tasks), *extra, "--out", str(out_dir), "--json",
               *(["--gpus", gpus] if gpus else [])]
    with CpuBusy() as cpu, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {}), "CUDA_AGENT_CACHE_DIR": str(cache_dir)}) as run:
        try:
            stdout, stderr = run.communicate(timeout=max(10, budget.left_s()))
        except subprocess.TimeoutExpired:
            run.terminate()  # SIGTERM: it stops its workers, keeping what it stored
            try:
                stdout, stderr = run.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
                stdout, stderr = run.communicate()
    if log is not None:
        log.write_text(stderr)
    complete = run.returncode in (0, 1) and stdout.strip().startswith("{")
    report = json.loads(stdout) if complete else stored_selfcheck(out_dir)  # stopped: read what the store holds
    counts = report["counts"] if report else {}
    return {"tasks": sum(counts.values()), "correct": counts.get("correct", 0), "task_error": counts.get("task_error", 0),
            "infra_error": counts.get("infra_error", 0), "counts": counts, "wall_s": time.monotonic() - started,
            "complete": complete, "returncode": run.returncode, "problems": report["problems"] if report else [],
            "cpu_busy": cpu.summary(),
            "stderr_tail": "" if run.returncode in (0, 1, 130) else stderr[-2000:]}  # why it failed, if it did


def stored_selfcheck(out_dir: Path) -> dict[str, Any] | None:
    """The self-check rows and counts a stopped ``tasks check`` left in its results store."""
    from collections import Counter

    from cuda_agent.evaluate.cli import selfcheck_row
    from cuda_agent.evaluate.store import STORE_FILE, ResultsStore

    if not (out_dir / STORE_FILE).is_file():
        return None
    store = ResultsStore.open_existing(out_dir / STORE_FILE)
    rows = [selfcheck_row(r) for r in store.records(out_dir.name)]
    return {"problems": rows, "counts": dict(Counter(r["status"] for r in rows))}


def check_rates(entry: dict[str, Any]) -> dict[str, float | None]:
    """Tasks judged a minute over the pass's wall time, and between its first and last verdicts."""
    finished = sorted(r["finished_at"] for r in entry["problems"] if r["phase_seconds"].get("total"))
    steady = 60 * (len(finished) - 1) / (finished[-1] - finished[0]) if len(finished) >= 3 else None
    return {"tasks_per_min": 60 * len(finished) / entry["wall_s"] if entry["wall_s"] else None,
            "steady_tasks_per_min": steady}


def check_medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median verdict, :func:`median_phases`, on a shared GPU the median of each verdict's
    ``device_seconds`` (waiting for its turns, holding the GPU alone, holding it shared), and the
    share of the baseline loops timed that ran out of budget and the share of the loops' seconds
    they took (on one H200, 12-17 % of the loops took 47-56 % of the seconds: the long pole of the time a
    verdict holds the GPU alone), over ``rows`` (tasks check's problems)."""
    timed = [row["phase_seconds"] for row in rows if row["phase_seconds"].get("total")]
    turns = [row["device_seconds"] for row in rows if row.get("device_seconds")]
    loops = [(name in row.get("baseline_exhausted", ()), row.get("baseline_seconds", {}).get(name, 0.0))
             for row in rows for name, source in row["baseline_sources"].items() if source == "timed"]
    loop_seconds = sum(seconds for _, seconds in loops)
    return {"median_verdict_s": median([s["total"] for s in timed]), "median_phase_s": median_phases(timed),
            "median_device_s": median_phases(turns) if turns else None,
            "baseline_loops_exhausted": sum(out for out, _ in loops) / len(loops) if loops else None,
            "baseline_seconds_exhausted": (sum(seconds for out, seconds in loops if out) / loop_seconds
                                           if loop_seconds else None)}


def device_held(entry: dict[str, Any]) -> dict[str, float] | None:
    """On a shared GPU, the share of a tasks-check run's wall time that its verdicts held the GPU
    alone (``measure``), held it shared and waited for it, summed over lanes (``use`` and ``wait``
    may exceed 1): a ``measure`` share near 1 means the GPU's turns, not the lanes, set the pace.
    ``measure_p90_s``: the 90th percentile of one verdict's time alone on the GPU (timing loops
    that run to their budget instead of their precision target make the long tail)."""
    turns = [row["device_seconds"] for row in entry["problems"] if row.get("device_seconds")]
    if not turns or not entry["wall_s"]:
        return None
    measured = sorted(t["measure"] for t in turns)
    return {**{kind: sum(t[kind] for t in turns) / entry["wall_s"] for kind in ("measure", "use", "wait")},
            "measure_p90_s": measured[int(0.9 * (len(measured) - 1))]}


def sample_task_files(tasks: Path, n: int, folder: Path, seed: int = 0, avoid: set[str] | None = None) -> Path:
    """``n`` tasks of the dataset (none of ``avoid``'s file names), picked with ``seed``, as files
    in ``folder``."""
    if not folder.is_dir():
        loaded = [r.task for r in load_tasks(tasks) if r.task is not None and f"{r.task.id}.py" not in (avoid or set())]
        folder.mkdir(parents=True)
        for task in random.Random(seed).sample(loaded, min(n, len(loaded))):
            (folder / f"{task.id}.py").write_text(task.code)
    return folder

"""Evaluations during an episode: the protected commands' service and the final scoring.

Each episode serves its protected ``build``/``verify``/``profile`` commands on a Unix socket in its
root (readable by the episode's sandbox uid only). A request snapshots the solution files and
hands the snapshot to the runner's :class:`EvaluationQueue`, which bounds how many evaluations run
at once over all episodes (one queue in front of the GPU or CPU evaluation slots). Every
evaluation, the final one included, becomes an :class:`EvaluationRecord` in the trajectory. The
final reward is always the trusted evaluator's verdict on the final workdir, never anything the
agent printed.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from cuda_agent.agent.workdir import Workdir
from cuda_agent.environment import EvalConfig, Prestarter, SolutionError, Task, Verdict, evaluate, load_solution
from cuda_agent.environment.build import CompileError, build_solution
from cuda_agent.environment.guards import run_static_guards
from cuda_agent.environment.slots import default_prestart_slots

logger = logging.getLogger(__name__)

OPS = ("build", "verify", "profile", "final")
"""``build``: static guards and compile; ``verify``: also correctness; ``profile`` and ``final``:
also timing and the reward (``final`` is the evaluator's own scoring of the final workdir)."""
_MAX_SUMMARY_CHARS = 6000


@dataclass
class EvaluationRecord:
    """One evaluation of a solution snapshot, as recorded in the trajectory."""

    number: int
    """0-based, in request order within the episode."""
    turn: int
    """The assistant turn whose tool call asked for it (the last turn for ``final``)."""
    op: str
    ok: bool
    """Built (``build``), correct (``verify``), correct and timed (``profile``, ``final``)."""
    reward: int | None
    """The milestone reward (``profile``, ``final``; ``verify`` reports at most 1; ``build`` none)."""
    summary: str
    """What the protected command printed for the agent."""
    wait_s: float
    """Seconds spent waiting for a free evaluation slot."""
    seconds: float
    """Seconds of the evaluation itself (snapshot excluded)."""
    verdict: dict[str, Any] | None = None
    """The full verify JSON contract (``Verdict.to_json_dict()``), for verify/profile/final."""
    build: dict[str, Any] | None = None
    """For ``build``: ``{"cached", "seconds", "key"}`` when it compiled."""
    skipped_files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling (0 for a cache hit)."""
        source = (self.verdict or {}).get("build") or self.build or {}
        return 0.0 if source.get("cached", True) else float(source.get("seconds") or 0.0)

    @property
    def timing_s(self) -> float:
        """Seconds spent timing the candidate (the ``profile`` phase)."""
        return float(((self.verdict or {}).get("phase_seconds") or {}).get("profile") or 0.0)


Evaluate = Callable[[Task, Path, EvalConfig, bool], Verdict]
"""``(task, solution path, config, profile) -> Verdict``: how an evaluation is carried out."""


class EvaluationQueue:
    """At most ``slots`` evaluations at once, over every episode of a runner; the blocking
    evaluator runs in worker threads so episodes keep talking to their policies meanwhile.

    Args:
        evaluator: what runs ``verify``/``profile``/``final`` evaluations; default: the trusted
            evaluator in this process (:class:`WarmEvaluator`: ``environment.evaluate`` on worker
            slots kept started ahead, so an agent's ``./verify`` does not wait for interpreters
            and CUDA contexts). A trainer on a cluster passes one that sends the snapshot to an
            evaluation pool or service (``build`` always compiles here).
    """

    def __init__(self, config: EvalConfig, slots: int = 1, evaluator: Evaluate | None = None) -> None:
        if slots < 1:
            raise ValueError(f"evaluation slots must be >= 1, got {slots}")
        self.config, self.slots = config, slots
        self._warm = WarmEvaluator(config, default_prestart_slots(config.device)) if evaluator is None else None
        self.evaluator: Evaluate = evaluator or self._warm
        self._slots = asyncio.Semaphore(slots)
        self._pool = ThreadPoolExecutor(slots, thread_name_prefix="evaluation")

    async def submit(self, work: Callable[[], Any]) -> tuple[Any, float, float]:
        """Run ``work()`` in a free slot; returns ``(result, wait_s, seconds)``."""
        queued = time.monotonic()
        async with self._slots:
            started = time.monotonic()
            result = await asyncio.get_running_loop().run_in_executor(self._pool, work)
        return result, started - queued, time.monotonic() - started

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._warm is not None:
            self._warm.close()


class EpisodeEvaluator:
    """The evaluations of one episode: the socket service and the final scoring."""

    def __init__(self, task: Task, workdir: Workdir, queue: EvaluationQueue, client_uid: int | None) -> None:
        self.task, self.workdir, self.queue, self.client_uid = task, workdir, queue, client_uid
        self.records: list[EvaluationRecord] = []
        self.turn = 0
        """Set by the loop before each tool call: evaluations are recorded under this turn."""
        self._server: asyncio.AbstractServer | None = None
        self._snapshot_lock = asyncio.Lock()

    async def start(self) -> None:
        """Listen on the episode's socket (bound through a directory descriptor: socket paths are
        limited to 107 bytes and episode roots can be longer)."""
        directory = os.open(self.workdir.root, os.O_PATH)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(f"/proc/self/fd/{directory}/{self.workdir.socket_path.name}")
        finally:
            os.close(directory)
        if self.client_uid is not None:
            os.chown(self.workdir.socket_path, 0, self.client_uid)
        self.workdir.socket_path.chmod(0o660)
        self._server = await asyncio.start_unix_server(self._serve, sock=listener)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def evaluate(self, op: str) -> EvaluationRecord:
        """Snapshot the solution now and evaluate it with ``op`` (one of :data:`OPS`)."""
        async with self._snapshot_lock:
            number = len(self.records)
            snapshot, skipped = self.workdir.snapshot(number)
            placeholder = EvaluationRecord(number, self.turn, op, False, None, "", 0.0, 0.0, skipped_files=skipped)
            self.records.append(placeholder)  # keeps numbers unique while the evaluation runs
        work = _build_only(snapshot, self.queue.config) if op == "build" else \
            _evaluation(self.queue.evaluator, self.task, snapshot, self.queue.config, profile=op != "verify")
        outcome, wait_s, seconds = await self.queue.submit(work)
        record = _record(placeholder, outcome, wait_s, seconds)
        self.records[number] = record
        logger.info("episode %s: %s #%d -> %s", self.workdir.root.name, op, number, record.summary.splitlines()[0])
        return record

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = json.loads(await reader.readline() or b"{}")
            op = request.get("op") if isinstance(request, dict) else None
            if op not in OPS[:3]:
                reply = {"text": f"unknown command {op!r}; use ./build, ./verify or ./profile\n", "exit_code": 2}
            else:
                record = await self.evaluate(op)
                reply = {"text": record.summary + "\n", "exit_code": 0 if record.ok else 1}
            writer.write(json.dumps(reply).encode())
            await writer.drain()
        except (ConnectionError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            logger.info("episode %s: bad request on the evaluation socket: %s", self.workdir.root.name, exc)
        finally:
            writer.close()


def _build_only(snapshot, config: EvalConfig) -> Callable[[], dict[str, Any]]:
    def work() -> dict[str, Any]:
        try:
            solution = load_solution(snapshot)
        except SolutionError as exc:
            return {"ok": False, "text": f"build: FAILED: {exc}"}
        violations = run_static_guards(solution, config.guards) if config.guards.enabled else []
        if violations:
            lines = "\n".join(f"  {v.code}: {v.message}" for v in violations)
            return {"ok": False, "text": f"build: FAILED: the static guards rejected the solution:\n{lines}"}
        try:
            built = build_solution(solution, config.device, config.build, config.cache_dir, config.sandbox)
        except CompileError as exc:
            return {"ok": False, "text": f"build: FAILED: {exc}\n{exc.log_tail}"}
        info = {"cached": built.info.cached, "seconds": built.info.seconds, "key": built.info.key}
        how = "from the build cache" if built.info.cached else f"compiled in {built.info.seconds:.1f} s"
        return {"ok": True, "text": f"build: OK ({solution.layout.value} layout, {how})", "build": info}

    return work


class WarmEvaluator:
    """``environment.evaluate`` on worker slots a :class:`Prestarter` keeps warm for ``config``,
    started at the first evaluation (a queue that never evaluates starts no process). Each slot
    serves one evaluation, as always; an evaluation under another configuration starts its own.
    Closed by the queue, or at interpreter exit for queues nobody closes (the verl adapter's)."""

    def __init__(self, config: EvalConfig, slots: int) -> None:
        self.config, self.slots = config, slots
        self._prestarter: Prestarter | None = None
        self._lock = threading.Lock()

    def __call__(self, task: Task, path: Path, config: EvalConfig, profile: bool) -> Verdict:
        with self._lock:
            if self._prestarter is None:
                self._prestarter = Prestarter(self.config, self.slots)
                atexit.register(self.close)
        return evaluate(task, path, config, profile=profile, prestarted=self._prestarter)

    def close(self) -> None:
        """After the last evaluation: destroy the slots nobody took."""
        with self._lock:
            if self._prestarter is not None:
                atexit.unregister(self.close)
                self._prestarter.close()
                self._prestarter = None


def _evaluation(evaluator: Evaluate, task: Task, snapshot: Path, config: EvalConfig,
                profile: bool) -> Callable[[], Verdict]:
    return lambda: evaluator(task, snapshot, config, profile)


def _record(placeholder: EvaluationRecord, outcome: Verdict | dict[str, Any], wait_s: float,
            seconds: float) -> EvaluationRecord:
    record = EvaluationRecord(placeholder.number, placeholder.turn, placeholder.op, False, None, "", wait_s, seconds,
                              skipped_files=placeholder.skipped_files)
    if isinstance(outcome, Verdict):
        record.verdict = outcome.to_json_dict()
        record.ok = outcome.correct
        record.reward = outcome.reward if placeholder.op != "verify" or not outcome.correct else None
        record.summary = summarize_verdict(placeholder.op, outcome)
    else:
        record.ok, record.summary, record.build = outcome["ok"], outcome["text"], outcome.get("build")
    if record.skipped_files:
        record.summary += "\nnot evaluated: " + "; ".join(record.skipped_files)
    if len(record.summary) > _MAX_SUMMARY_CHARS:
        record.summary = record.summary[: _MAX_SUMMARY_CHARS // 2] + "\n[...]\n" + record.summary[-_MAX_SUMMARY_CHARS // 2:]
    return record


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g} ms"


def summarize_verdict(op: str, verdict: Verdict) -> str:
    """The few lines a protected command prints for a verdict."""
    trials = f"{sum(t.passed for t in verdict.trials)}/{len(verdict.trials)} correctness trials passed"
    if not verdict.correct:
        lines = [f"{op}: FAILED ({verdict.status.value}); {trials}"]
        lines += [f"  {v.code}: {v.message}" for v in verdict.violations]
        if verdict.error:
            lines.append(verdict.error.strip())
        return "\n".join(lines)
    if op == "verify":
        return f"verify: PASSED; {trials} (precision policy {verdict.precision_policy}); run ./profile to time it"
    lines = [f"{op}: reward {verdict.reward} (correct; {trials})",
             f"  candidate {_ms(verdict.candidate_ms)}; eager {_ms(verdict.eager_ms)}"
             + (f" (speed-up {verdict.speedup_vs_eager:.3g}x)" if verdict.speedup_vs_eager else ""),
             f"  torch.compile {_ms(verdict.compile_ms)}"
             + (f" (speed-up {verdict.speedup_vs_compile:.3g}x)" if verdict.speedup_vs_compile else "")]
    lines += [f"  note: {note}" for note in verdict.notes if not note.startswith("weights:")]
    lines.append("  reward: -1 failed, 1 correct, 2 >5% faster than eager, 3 also >5% faster than torch.compile")
    return "\n".join(lines)

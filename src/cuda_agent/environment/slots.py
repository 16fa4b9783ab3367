"""Worker slots: everything of one evaluation that does not depend on its task or candidate.

A slot is a scratch folder, a sandbox lease, and two freshly started workers (the trusted
reference worker and the untrusted candidate worker, the latter already inside its sandbox). It
serves exactly one evaluation and is then destroyed: no worker ever sees a second task or a second
candidate. Starting a slot costs two interpreter starts, ``import torch`` and (on CUDA) a context
each — seconds that :class:`Prestarter` takes off the critical path by starting slots ahead, with
nothing candidate-specific loaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from cuda_agent.environment import sandbox
from cuda_agent.environment.config import EvalConfig
from cuda_agent.environment.device_share import DeviceShare
from cuda_agent.environment.import_ahead import MAX_MODULES, modules_imported
from cuda_agent.environment.timed_cpus import split_for
from cuda_agent.environment.worker import WorkerProcess, child_env

if TYPE_CHECKING:
    from cuda_agent.environment.verdict import Verdict

logger = logging.getLogger(__name__)


def default_scratch_root() -> Path:
    """Where evaluations put their temporary files unless ``EvalConfig.scratch_dir`` says otherwise:
    /dev/shm when writable (the CPU backend's shared inputs and outputs are memory-speed files
    both workers map), else the temp dir."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


def slot_key(config: EvalConfig) -> tuple:
    """What a slot was started for: a slot serves only evaluations with the same key."""
    return (config.device, config.limits, config.sandbox, config.build.cuda_arch, config.scratch_dir)


class WorkerSlot:
    """One evaluation's scratch folder, sandbox lease and blank workers.

    Layout of ``scratch``: ``task/`` and ``io/`` (written by the trusted side, read-only to the
    candidate: the task file, and on the CPU backend the shared input files), ``solution/`` (a
    root-owned copy of the candidate's Python files), ``candidate/`` (its workdir) and ``out/``
    (on the CPU backend, the output files it shares back), the last two owned by the sandbox user.
    """

    def __init__(self, config: EvalConfig, warm_device: bool = True, imports: tuple[str, ...] = (),
                 evaluations: int = 1) -> None:
        """``warm_device``: have both workers initialise ``config.device`` as soon as they start
        (else only their host side: imports and first CPU calls; see :meth:`warm`). ``imports``:
        modules both workers import as they start (see :mod:`~cuda_agent.environment.import_ahead`).
        ``evaluations``: how many evaluations share the GPU (``DeviceShare.evaluations``; 1: alone)."""
        self.key = slot_key(config)
        self.device = config.device
        self.evaluations = evaluations
        self.cpu_split = split_for(config.device)
        """Both workers start off the CPUs set apart for timing; see ``timed_cpus``."""
        self._close_lock, self._closed = threading.Lock(), False
        self.on_close: Callable[[], None] | None = None
        """Called once the slot is closed (a :class:`Prestarter` that starts the next slot only then)."""
        self.device_turns: list[dict[str, Any]] = []
        """The turn :meth:`warm` held ``device_gate`` for, in the form of ``Verdict.device_turns``
        (phase ``slot_warm``): on a shared GPU, the verdict that takes the slot reports it."""
        self.scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-", dir=config.scratch_dir or default_scratch_root()))
        self.scratch.chmod(0o711)  # the sandbox user may enter it, not list it
        self.reference: WorkerProcess | None = None
        self.candidate: WorkerProcess | None = None
        self.lease: sandbox.Lease | None = None
        try:
            self._start(config)
            self._send_warm(config.device if warm_device else "cpu", imports)
        except BaseException:
            self.close()
            raise

    @property
    def extensions_dir(self) -> Path:
        """The candidate's own copy of the built extensions: the build cache is never exposed to it."""
        return self.scratch / "extensions"

    def _start(self, config: EvalConfig) -> None:
        for name in ("task", "io", "solution"):
            (self.scratch / name).mkdir(mode=0o755)
        self.lease = sandbox.acquire(config.sandbox, config.device, self.scratch)  # SandboxError: bad config, raised
        for name in ("candidate", "out"):
            (self.scratch / name).mkdir(mode=0o700)
            self.lease.give_to_candidate(self.scratch / name)
        self.reference = WorkerProcess(
            "cuda_agent.environment.reference_worker", env=child_env(), cwd=self.scratch,
            log_path=self.scratch / "reference.log", cpu_split=self.cpu_split,
        )
        workdir = self.scratch / "candidate"
        user = "cuda-agent-sandbox"  # the sandbox uid has no passwd entry: getpass.getuser() reads these
        env = child_env({"TORCH_CUDA_ARCH_LIST": config.build.cuda_arch, "HOME": str(workdir),
                         "TMPDIR": str(workdir), "TORCH_EXTENSIONS_DIR": str(self.extensions_dir),
                         "USER": user, "LOGNAME": user})
        preexec = self.lease.preexec(config.limits, workdir=workdir)
        self.candidate = WorkerProcess(
            "cuda_agent.environment.candidate_worker", env=env, cwd=workdir,
            log_path=self.scratch / "candidate.log", mem_mb=config.limits.mem_mb, preexec=preexec,
            disk_dirs=(workdir, self.scratch / "out", self.extensions_dir), disk_mb=config.limits.disk_mb,
            cpu_split=self.cpu_split,
        )

    def _send_warm(self, device: str, imports: tuple[str, ...] = ()) -> None:
        for worker in (self.reference, self.candidate):  # both warm up at once, before anyone waits
            assert worker is not None
            worker.send({"op": "warm", "device": device, "imports": list(imports), "evaluations": self.evaluations},
                        background=True)

    def warm(self, timeout_s: float, device_gate: contextlib.AbstractContextManager | None = None,
             compile_mode: str | None = None) -> None:
        """Wait until both workers have imported what they need and initialised the device (before
        any task or candidate exists), so the evaluation that takes this slot does not wait for it.
        A slot started without ``warm_device`` initialises the device now, holding ``device_gate``
        while it does (a context being made on a GPU that is timing a candidate would disturb it).
        ``compile_mode``: also warm ``torch.compile`` up in the reference worker (host work, outside
        the gate), for evaluations that will compile their baseline."""
        for worker in (self.reference, self.candidate):
            assert worker is not None
            worker.wait_background(timeout_s)
        if self.device == "cpu":
            return
        asked, asked_at = time.monotonic(), time.time()
        with device_gate or contextlib.nullcontext():
            entered = time.monotonic()
            self._send_warm(self.device)
            for worker in (self.reference, self.candidate):
                worker.wait_background(timeout_s)
        if device_gate is not None:
            self.device_turns.append({"phase": "slot_warm", "mode": "use", "asked_at": asked_at,
                                      "wait_s": entered - asked, "held_s": time.monotonic() - entered})
        if compile_mode is not None:
            self.reference.send({"op": "warm_compile", "device": self.device, "mode": compile_mode}, background=True)
            self.reference.wait_background(timeout_s)

    def close(self) -> None:
        """Stop both workers (and everything they started), free the lease, remove the scratch.
        Once, whoever calls: a prestarter closing a slot mid-warm-up and the warm-up thread that
        then sees its workers die both close it (seen on a GPU host as a lease's lock descriptor
        closed twice, which could close a descriptor reused in between)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._stop()
        if self.on_close is not None:
            self.on_close()

    def _stop(self) -> None:
        for worker in (self.candidate, self.reference):
            if worker is not None:
                worker.close()
        if self.lease is not None:
            self.lease.release()
        shutil.rmtree(self.scratch, ignore_errors=True)


def default_prestart_slots(device: str) -> int:
    """Worker slots to keep warm ahead of a stream of evaluations. On CUDA, starting a slot (two
    interpreters with torch, CUDA contexts and the sandbox) takes ~3-7 s on an H100/H200 host and
    longer while builds load its cores, against ~2.5 s for a warm evaluation of an L1-size kernel:
    with 2 slots an H200 throughput run still spent a third of its evaluation time waiting for the
    next slot, so hosts with 12 or more cores keep 3 (2 below that). The CPU backend keeps 1: its
    slots compete with the evaluation for the cores."""
    if device != "cuda":
        return 1
    return 3 if (os.cpu_count() or 1) >= 12 else 2


class Prestarter:
    """Keeps ``count`` slots for one configuration started and warmed ahead of the evaluations.

    Slots are started by one long-lived thread: workers are killed when the thread that started
    them exits (``PR_SET_PDEATHSIG``), so :meth:`close` — which ends that thread — must come after
    the last evaluation using a slot from here has finished. Use as a context manager.

    When a slot is taken, the next one starts at once on CUDA (its interpreters load the host while
    the GPU times), but only once the taken slot is closed on the CPU backend: there a slot
    starting (two interpreters importing torch) competes with the evaluation for the cores its
    timing runs on. On a 2-core machine it slowed each keep-warm verdict by about 1.5 s and spread
    the candidate's timing from 0.5-11 % to 13-32 % relative standard error
    (``bench/results/keep_warm_cpu.json``).
    """

    def __init__(self, config: EvalConfig, count: int = 1, warm_timeout_s: float = 300.0,
                 share: DeviceShare | None = None) -> None:
        """``share``: the GPU is shared with evaluations of other processes (see
        :mod:`~cuda_agent.environment.device_share`): slots initialise their device holding it
        for untimed device work."""
        if count < 1:
            raise ValueError(f"Prestarter count must be >= 1, got {count}")
        self.config, self.count, self.warm_timeout_s, self.share = config, count, warm_timeout_s, share
        self._ready: queue.Queue[WorkerSlot | None] = queue.Queue()
        self._wanted = threading.Semaphore(count)
        self._closed = threading.Event()
        self._device_gate = threading.Lock()
        self._lock = threading.Lock()
        self._warming: dict[WorkerSlot, threading.Thread] = {}
        self.compile_ahead = config.device == "cuda" and config.timing.compile_baseline
        """Whether the slots started next also warm ``torch.compile`` up: at first wherever a baseline
        is compiled, then as the last verdict says (:meth:`note_verdict`)."""
        self._imports: dict[str, None] = {}
        """Modules the tasks served so far import (:meth:`note_task`): slots started next import them."""
        self._thread = threading.Thread(target=self._run, name="cuda-agent-prestarter", daemon=True)
        self._thread.start()

    def __enter__(self) -> "Prestarter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self, config: EvalConfig) -> WorkerSlot | None:
        """A warm slot for ``config`` (waiting for the one being started), or None when this
        prestarter serves another configuration or is closed."""
        if slot_key(config) != slot_key(self.config) or self._closed.is_set():
            return None
        slot = self._ready.get()
        if slot is None or self.config.device == "cuda":
            self._wanted.release()  # start the next one now, while this one is used
        else:
            slot.on_close = self._wanted.release
        return slot

    def note_task(self, code: str) -> None:
        """Learn the modules a task's code imports (up to :data:`MAX_MODULES` per stream): the
        slots started from now on import them while they wait, instead of the next verdicts."""
        if len(self._imports) >= MAX_MODULES:
            return  # full: the stream's tasks (often the same code again) are not parsed any more
        with self._lock:
            for name in modules_imported(code)[:MAX_MODULES - len(self._imports)]:
                self._imports.setdefault(name)

    def note_verdict(self, verdict: Verdict) -> None:
        """Learn from a finished evaluation whether this stream's evaluations compile their
        baseline (it was timed, not cached: a self-check, tasks new to the cache). Then the slots
        started next warm ``torch.compile`` up while they wait (5-7 s of host work each), and skip
        it while baselines come from the cache."""
        self.compile_ahead = self.config.device == "cuda" and any(
            variant.startswith("compile") and source == "timed" for variant, source in verdict.baseline_sources.items())

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until a slot is started and warm, ready to be taken (False: none within the time)."""
        with self._ready.not_empty:
            return self._ready.not_empty.wait_for(lambda: self._ready._qsize() > 0, timeout_s)

    @contextlib.contextmanager
    def quiet_device(self) -> Iterator[None]:
        """Hold back the device initialisation of the slots being prestarted (waiting for one in
        progress) while the block runs: an evaluation times its candidate inside this."""
        with self._device_gate:
            yield

    def _run(self) -> None:
        """Start a slot per permit, at once; each warms up in a thread of its own, so slots that
        take seconds to start come up side by side (exec'd workers stay tied to this thread, which
        started them)."""
        while True:
            self._wanted.acquire()
            if self._closed.is_set():
                return
            try:
                with self._lock:
                    imports = tuple(self._imports)
                slot = WorkerSlot(self.config, warm_device=False, imports=imports,
                                  evaluations=1 if self.share is None else self.share.evaluations)
            except Exception:  # noqa: BLE001 - the evaluation then starts its own slot and reports the failure
                logger.exception("prestarting a worker slot failed")
                self._ready.put(None)
                continue
            warming = threading.Thread(target=self._warm, args=(slot,), name="cuda-agent-prestart-warm", daemon=True)
            with self._lock:
                self._warming[slot] = warming
            warming.start()

    def _warm(self, slot: WorkerSlot) -> None:
        warm: WorkerSlot | None = slot
        try:
            slot.warm(self.warm_timeout_s, self._device_gate if self.share is None else self.share.use(),
                      self.config.timing.compile_mode if self.compile_ahead else None)
        except Exception:  # noqa: BLE001 - as above
            if not self._closed.is_set():
                logger.exception("warming a prestarted worker slot failed")
            slot.close()
            warm = None
        self._ready.put(warm)  # before leaving the set close() waits for: it then finds it in the queue
        with self._lock:
            self._warming.pop(slot, None)

    def close(self) -> None:
        """Stop prestarting and destroy the slots nobody took."""
        self._closed.set()
        self._wanted.release()
        self._thread.join()
        with self._lock:
            warming = dict(self._warming)
        for slot, thread in warming.items():  # killed: its warm-up thread sees the workers die
            slot.close()
            thread.join()
        while not self._ready.empty():
            slot = self._ready.get_nowait()
            if slot is not None:
                slot.close()

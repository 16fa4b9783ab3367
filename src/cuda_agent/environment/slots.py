"""Worker slots: everything of one evaluation that does not depend on its task or candidate.

A slot is a scratch folder, a sandbox lease, and two freshly started workers (the trusted
reference worker and the untrusted candidate worker, the latter already inside its sandbox). It
serves exactly one evaluation and is then destroyed: no worker ever sees a second task or a second
candidate. Starting a slot costs two interpreter starts, ``import torch`` and (on CUDA) a context
each — seconds that :class:`Prestarter` takes off the critical path by starting slots ahead, with
nothing candidate-specific loaded.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading
from pathlib import Path

from cuda_agent.environment import sandbox
from cuda_agent.environment.config import EvalConfig
from cuda_agent.environment.worker import WorkerError, WorkerProcess, child_env

logger = logging.getLogger(__name__)


def default_scratch_root() -> Path:
    """Where evaluations put their temporary files unless ``EvalConfig.scratch_dir`` says otherwise:
    /dev/shm when writable (inputs and outputs are memory-speed files), else the temp dir."""
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
    candidate), ``solution/`` (a root-owned copy of the candidate's Python files), ``candidate/``
    (its workdir) and ``out/`` (its outputs), the last two owned by the sandbox user.
    """

    def __init__(self, config: EvalConfig) -> None:
        self.key = slot_key(config)
        self.scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-", dir=config.scratch_dir or default_scratch_root()))
        self.scratch.chmod(0o711)  # the sandbox user may enter it, not list it
        self.reference: WorkerProcess | None = None
        self.candidate: WorkerProcess | None = None
        self.lease: sandbox.Lease | None = None
        try:
            self._start(config)
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
            log_path=self.scratch / "reference.log",
        )
        workdir = self.scratch / "candidate"
        user = "cuda-agent-sandbox"  # the sandbox uid has no passwd entry: getpass.getuser() reads these
        env = child_env({"TORCH_CUDA_ARCH_LIST": config.build.cuda_arch, "HOME": str(workdir),
                         "TMPDIR": str(workdir), "TORCH_EXTENSIONS_DIR": str(self.extensions_dir),
                         "USER": user, "LOGNAME": user})
        preexec = self.lease.preexec(config.limits, limit_address_space=config.device == "cpu", workdir=workdir)
        self.candidate = WorkerProcess(
            "cuda_agent.environment.candidate_worker", env=env, cwd=workdir,
            log_path=self.scratch / "candidate.log", mem_mb=config.limits.mem_mb, preexec=preexec,
            disk_dirs=(workdir, self.scratch / "out", self.extensions_dir), disk_mb=config.limits.disk_mb,
        )

    def warm(self, device: str, timeout_s: float) -> None:
        """Have both workers import what they need and initialise ``device`` now (before any task
        or candidate exists), so the evaluation that takes this slot does not wait for it."""
        for worker in (self.reference, self.candidate):
            assert worker is not None
            worker.request({"op": "warm", "device": device}, timeout_s)

    def close(self) -> None:
        """Stop both workers (and everything they started), free the lease, remove the scratch."""
        workers = [w for w in (self.candidate, self.reference) if w is not None]
        for worker in workers:
            worker.ask_to_exit()  # both interpreters shut down at once
        for worker in workers:
            worker.close()
        if self.lease is not None:
            self.lease.release()
        shutil.rmtree(self.scratch, ignore_errors=True)


class Prestarter:
    """Keeps ``count`` slots for one configuration started and warmed ahead of the evaluations.

    Slots are started by one long-lived thread: workers are killed when the thread that started
    them exits (``PR_SET_PDEATHSIG``), so :meth:`close` — which ends that thread — must come after
    the last evaluation using a slot from here has finished. Use as a context manager.
    """

    def __init__(self, config: EvalConfig, count: int = 1, warm_timeout_s: float = 300.0) -> None:
        if count < 1:
            raise ValueError(f"Prestarter count must be >= 1, got {count}")
        self.config, self.count, self.warm_timeout_s = config, count, warm_timeout_s
        self._ready: queue.Queue[WorkerSlot | None] = queue.Queue()
        self._wanted = threading.Semaphore(count)
        self._closed = threading.Event()
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
        self._wanted.release()  # start the next one now, while this one is used
        return slot

    def _run(self) -> None:
        while True:
            self._wanted.acquire()
            if self._closed.is_set():
                return
            try:
                slot = WorkerSlot(self.config)
                try:
                    slot.warm(self.config.device, self.warm_timeout_s)
                except WorkerError:
                    slot.close()
                    raise
            except Exception:  # noqa: BLE001 - the evaluation then starts its own slot and reports the failure
                logger.exception("prestarting a worker slot failed")
                slot = None
            self._ready.put(slot)

    def close(self) -> None:
        """Stop prestarting and destroy the slots nobody took."""
        self._closed.set()
        self._wanted.release()
        self._thread.join()
        while not self._ready.empty():
            slot = self._ready.get_nowait()
            if slot is not None:
                slot.close()

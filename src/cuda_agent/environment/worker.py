"""Child processes of an evaluation and the private channel the parent talks to them over.

Each worker is a fresh interpreter, never a fork of the parent (exec'd, or forked from a worker
zygote that imported torch and nothing task-specific: see ``zygote``), in its own process group,
so the parent can always kill it and everything it started. Requests and replies are JSON lines
over a dedicated pipe pair; the worker's stdout/stderr go to a log file and are never parsed for
results. A worker that crashes, hangs or grows past its memory limit turns into a typed exception
in the parent, which the evaluator maps to a verdict.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import cuda_agent
from cuda_agent.environment.device_share import CONV_WORKSPACE_VARIABLE, conv_workspace_cap_mb
from cuda_agent.environment.import_ahead import import_ahead
from cuda_agent.environment.timed_cpus import CpuSplit, start_off_timed

_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
_ENV_KEEP = (
    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
    "CC", "CXX", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_COMPILE_THREADS",  # the baseline's torch.compile: inductor's code-generation processes
    "CUDNN_CONV_WSCAP_DBG",  # a user's cap on cuDNN's convolution workspace (MiB)
)


class WorkerError(RuntimeError):
    """Base class: the worker process did not answer a request normally."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class WorkerDied(WorkerError):
    """The worker exited or was killed by a signal (segfault, abort, ...) before replying."""


class WorkerTimeout(WorkerError):
    """The worker did not reply within the request's time limit and was killed."""


class WorkerMemoryExceeded(WorkerError):
    """The worker's own memory (anonymous resident memory: what it allocated, not the shared
    memory the harness maps into it) exceeded its limit and it was killed."""


class WorkerDiskExceeded(WorkerError):
    """The worker wrote more into its writable folders than its limit and was killed."""


class WorkerProtocolError(WorkerError):
    """The worker replied with something that is not a valid message."""


class ForgedReply(WorkerProtocolError):
    """A reply did not carry the request's nonce: something other than the harness loop wrote it
    (candidate code forging a result on the inherited pipe)."""


class RemoteError(RuntimeError):
    """The worker handled the request but the operation raised; carries the remote details."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.error_type = str(reply.get("error_type", "Exception"))
        self.detail = str(reply.get("error", ""))
        self.traceback = str(reply.get("traceback", ""))
        self.reply = reply
        super().__init__(f"{self.error_type}: {self.detail}")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A cleaned environment for a worker: a short allow-list plus what makes cuda_agent importable."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    package_root = str(Path(cuda_agent.__file__).resolve().parents[1])
    env["PYTHONPATH"] = package_root
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class WorkerProcess:
    """Parent-side handle on one worker: launch, request/reply with limits, kill. With a
    ``cpu_split`` the worker starts on its ``others`` CPUs (see ``timed_cpus``)."""

    def __init__(
        self,
        module: str,
        *,
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        mem_mb: int | None = None,
        preexec: Callable[[], None] | None = None,
        disk_dirs: tuple[Path, ...] = (),
        disk_mb: int | None = None,
        cpu_split: CpuSplit | None = None,
    ) -> None:
        self.module = module
        self.log_path = log_path
        self.mem_mb = mem_mb
        """Limit on the worker's anonymous resident memory; the evaluator may raise it once it
        knows what the harness itself will hold in the worker."""
        self.disk_dirs, self.disk_mb = disk_dirs, disk_mb
        self.last_rss_mb = 0.0
        """The worker's anonymous resident memory when last sampled (what it held before dying)."""
        self._oom_kills_at_start = oom_kill_count()
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()
        self._buffer = b""
        self._pending: collections.deque[tuple[str, str, float, bool]] = collections.deque()
        """``(op, nonce, sent at, background)`` of requests whose replies were not received yet."""
        self.request_seconds: list[tuple[str, float, float]] = []
        """``(op, sent at (time.monotonic()), seconds from sending to reply)`` of every answered
        request, in order: where an evaluation's time went (pipelined requests overlap)."""
        # Imported here: workers load this module too (the toy worker without its package) and start none.
        from cuda_agent.environment.zygote import zygote_for

        preexec = start_off_timed(cpu_split, preexec or _no_core_dumps)
        zygote = zygote_for(module, env)
        with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self.proc: Any = None  # a subprocess.Popen, or the zygote's ForkedProcess
            if zygote is not None:
                with contextlib.suppress(OSError):  # the zygote is gone: start the worker the slow way
                    self.proc = zygote.spawn(module, env=env, cwd=cwd, log_fd=log.fileno(), fd_in=to_child_r,
                                             fd_out=from_child_w, preexec=preexec)
            if self.proc is None:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", module, "--fd-in", str(to_child_r), "--fd-out", str(from_child_w)],
                    pass_fds=(to_child_r, from_child_w),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=preexec,
                )
        os.close(to_child_r)
        os.close(from_child_w)

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait for its reply.

        Raises:
            WorkerTimeout, WorkerDied, WorkerMemoryExceeded, WorkerProtocolError: the worker failed
                (it is dead afterwards).
            RemoteError: the worker ran the operation and it raised (the worker lives on).
        """
        self.send(message)
        return self.receive(timeout_s)

    def send(self, message: dict[str, Any], background: bool = False) -> None:
        """Queue one request without waiting: the worker handles requests in order, and
        :meth:`receive` returns their replies in the same order (requests pipelined this way cost
        no round trip each). The reply to a ``background`` request (a warm-up) is not returned: the
        next :meth:`receive` or :meth:`wait_background` takes it, raising if it failed."""
        if self._to_child_w < 0:
            raise WorkerDied("worker was already stopped", self.log_tail())
        nonce = secrets.token_hex(16)
        op = str(message.get("op", "?"))
        try:
            _write_all(self._to_child_w, (json.dumps({**message, "nonce": nonce}) + "\n").encode())
        except BrokenPipeError:
            self._fail(WorkerDied, "worker exited before the request could be sent")
        self._pending.append((op, nonce, time.monotonic(), background))

    def wait_background(self, timeout_s: float) -> None:
        """Take the replies of the background requests sent before any other pending request."""
        while self._pending and self._pending[0][3]:
            self._take_reply(timeout_s)

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The reply to the oldest request not yet received (background ones taken first), waiting
        at most ``timeout_s`` for each.

        Raises: as :meth:`request`.
        """
        self.wait_background(timeout_s)
        if not self._pending:
            raise WorkerProtocolError("receive() without a request waiting for its reply")
        return self._take_reply(timeout_s)

    def _take_reply(self, timeout_s: float) -> dict[str, Any]:
        op, nonce, sent, _ = self._pending[0]
        reply = self._read_reply(time.monotonic() + timeout_s, op, timeout_s)
        self._pending.popleft()
        self.request_seconds.append((op, sent, time.monotonic() - sent))
        if reply.pop("nonce", None) != nonce:
            self._fail(ForgedReply, f"the reply to {op!r} does not carry the request's nonce: it was not written "
                                    "by the harness (forged on the result pipe)")
        if not reply.get("ok", False):
            raise RemoteError(reply)
        return reply

    def _read_reply(self, deadline: float, op: str, timeout_s: float) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(WorkerTimeout, f"no reply to {op!r} within {timeout_s:g} s")
            ready, _, _ = select.select([self._from_child_r], [], [], min(remaining, 0.25))
            self._check_limits()
            if not ready:
                continue
            chunk = os.read(self._from_child_r, 1 << 20)
            if not chunk:
                self.proc.wait()
                self._fail(WorkerDied, f"worker {signal_name(self.proc.returncode)} during {op!r}"
                                       + (" (out of memory: the kernel's out-of-memory killer ended it, holding "
                                          f"{self.last_rss_mb:.0f} MB)" if self.oom_killed() else ""))
            self._buffer += chunk
            if len(self._buffer) > _MAX_MESSAGE_BYTES:
                self._fail(WorkerProtocolError, f"reply to {op!r} exceeds {_MAX_MESSAGE_BYTES} bytes")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            self._fail(WorkerProtocolError, f"reply to {op!r} is not valid JSON")
        if not isinstance(reply, dict):
            self._fail(WorkerProtocolError, f"reply to {op!r} is not a JSON object")
        return reply

    def _check_limits(self) -> None:
        rss_mb = _status_mb(self.proc.pid, "RssAnon")
        if rss_mb is not None:
            self.last_rss_mb = rss_mb
            if self.mem_mb is not None and rss_mb > self.mem_mb:
                self._fail(WorkerMemoryExceeded, f"worker used {rss_mb:.0f} MB, over its {self.mem_mb} MB limit")
        if self.disk_mb is not None and self.disk_dirs:
            written_mb = _tree_bytes(self.disk_dirs, self.disk_mb * 1024 * 1024) / 2**20
            if written_mb > self.disk_mb:
                self._fail(WorkerDiskExceeded, f"worker wrote over {self.disk_mb} MB into its folders "
                                               f"({written_mb:.0f} MB seen), over its limit")

    def oom_killed(self) -> bool:
        """Whether the worker died of SIGKILL while the kernel's out-of-memory killer struck in
        this process's memory cgroup (the cgroup's ``oom_kill`` count rose since it started)."""
        if self.proc.returncode != -signal.SIGKILL:
            return False
        count = oom_kill_count()
        return count is not None and self._oom_kills_at_start is not None and count > self._oom_kills_at_start

    @property
    def idle(self) -> bool:
        """Alive, with no request waiting for its reply."""
        return self.proc.poll() is None and not self._pending and self._to_child_w >= 0

    def peak_rss_mb(self) -> float | None:
        """The worker's peak resident memory so far (``VmHWM``; None once it is gone)."""
        return _status_mb(self.proc.pid, "VmHWM")

    def rss_mb(self) -> float | None:
        """The worker's resident memory now (``VmRSS``; None once it is gone)."""
        return _status_mb(self.proc.pid, "VmRSS")

    def _fail(self, exc_type: type[WorkerError], message: str) -> None:
        self.kill()
        raise exc_type(message, self.log_tail())

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kill_group(self) -> None:
        """SIGKILL the worker's whole process group (children the worker started may outlive its
        leader), without reaping it or closing the pipes: safe from another thread while one waits
        for a reply, which then sees the worker die."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """Kill the worker's whole process group and reap it (idempotent)."""
        self.kill_group()
        self.proc.wait()
        for fd in (self._to_child_w, self._from_child_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._to_child_w = self._from_child_r = -1

    def close(self, graceful_s: float = 0.0) -> None:
        """Stop the worker and its process group. By default at once: nothing an evaluation's
        worker holds is needed after its last reply (results travel in replies and files), so it is
        killed, never awaited. ``graceful_s`` > 0 first asks it to exit and waits that long (a
        worker that must release what it holds itself, such as a pool lane's sandbox leases)."""
        if graceful_s > 0 and self.proc.poll() is None and self._to_child_w >= 0:
            try:
                os.write(self._to_child_w, b'{"op": "exit"}\n')
                self.proc.wait(timeout=graceful_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def die_with_parent() -> None:
    """Have the kernel SIGKILL this (child) process when the thread that started it exits, so a
    killed evaluator leaves no orphan writing into caches. Call last: a uid change clears it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _no_core_dumps() -> None:  # runs in the child between fork and exec
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    die_with_parent()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _tree_bytes(roots: tuple[Path, ...], stop_at: int, max_entries: int = 100_000) -> int:
    """Bytes the files below ``roots`` take on their file system (allocated blocks: a sparse file,
    such as a share sized by ``ftruncate`` before its first write, holds only what was written);
    stops early once past ``stop_at``. A tree of more than ``max_entries`` entries counts as over
    the limit (walking it would stall the parent)."""
    total = entries = 0
    for root in roots:
        for directory, _, files in os.walk(root):
            for name in files:
                entries += 1
                try:
                    total += os.lstat(os.path.join(directory, name)).st_blocks * 512
                except OSError:
                    continue
                if total > stop_at or entries > max_entries:
                    return max(total, stop_at + 1)
    return total


def _status_mb(pid: int, field: str) -> float | None:
    """A memory figure (kB in the file) of ``/proc/<pid>/status`` in MB, None when unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_host_bytes() -> int:
    """Host memory available to new allocations now (``MemAvailable``; the total where unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def oom_kill_count() -> int | None:
    """How many processes the kernel's out-of-memory killer ended in this process's memory cgroup
    (cgroup v2 ``memory.events``, or v1 ``memory.oom_control``); None where neither is readable."""
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.strip().split(":", 2) for line in f]
    except OSError:
        return None
    candidates = [f"/sys/fs/cgroup{path}/memory.events" for hierarchy, _, path in entries if hierarchy == "0"]
    candidates += [f"/sys/fs/cgroup/memory{path}/memory.oom_control" for _, controllers, path in entries
                   if "memory" in controllers.split(",")]
    candidates.append("/sys/fs/cgroup/memory/memory.oom_control")  # a container's own v1 root
    for candidate in candidates:
        try:
            with open(candidate) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return None


def peak_memory(device: str) -> dict[str, float]:
    """Worker side: this process's peak host memory and, on CUDA, its peak device memory (torch's
    allocator and the shared blocks allocated beside it) in MB: allocated, and reserved (what the
    process held from the device, cached blocks included: what other evaluations sharing the GPU
    could not use)."""
    peak = {"peak_host_mb": _status_mb(os.getpid(), "VmHWM") or 0.0}
    if device == "cuda":
        import torch

        from cuda_agent.environment.cuda_ipc import peak_block_bytes

        peak["peak_device_mb"] = (torch.cuda.max_memory_allocated() + peak_block_bytes()) / 2**20
        peak["peak_device_reserved_mb"] = (torch.cuda.max_memory_reserved() + peak_block_bytes()) / 2**20
    return peak


def cap_address_space(limit_mb: int) -> None:
    """Worker side: let the address space grow only by the part of ``limit_mb`` that resident
    memory does not use yet (what is mapped now plus ``limit_mb`` minus the resident size).

    Called before untrusted code is loaded, so the cap does not charge it for what is mapped but
    not resident (a CUDA build of torch maps several GB of libraries; started thread pools reserve
    stacks and malloc arenas), while an allocation that would take the process past ``limit_mb``
    resident fails inside it (``MemoryError``) before the parent's resident-memory watchdog has to
    kill it. The hard limit is lowered too, so the code loaded after cannot raise it again."""
    import resource

    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    mapped, resident = (int(fields[key].split()[0]) * 1024 for key in ("VmSize", "VmRSS"))
    cap = mapped + max(limit_mb * 2**20 - resident, 64 * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


Handler = Callable[[dict[str, Any]], dict[str, Any]]


_device_memory_cap: dict[str, int] = {}
"""``{"bytes": n}`` once :func:`warm_device` capped this process's allocator on a shared GPU."""


def device_memory_cap_mb() -> int | None:
    """The cap :func:`warm_device` put on this process's device allocator (MiB), if any."""
    return _device_memory_cap["bytes"] // 2**20 if "bytes" in _device_memory_cap else None


def warm_device(msg: dict[str, Any]) -> dict[str, Any]:
    """Initialise the device before any task or candidate is loaded (a worker's first request,
    sent as it starts): the evaluation that takes the worker does not wait for a CUDA context.
    The modules in ``imports`` (what earlier tasks of the stream imported) are imported first. With
    ``evaluations`` > 1 the GPU is shared: before any task code runs, the worker's allocator is
    capped at its evaluation's share of the device, and cuDNN's convolution workspace at half of it
    (see :mod:`~cuda_agent.environment.device_share`). Workers whose first real request needs more
    (imports, probes) register their own ``warm``."""
    import torch

    import_ahead(msg.get("imports", ()))
    if msg["device"] == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        evaluations = msg.get("evaluations", 1)
        if evaluations > 1:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.set_per_process_memory_fraction(1 / evaluations)
            _device_memory_cap["bytes"] = total // evaluations
            if CONV_WORKSPACE_VARIABLE not in os.environ:  # a user's own cap is kept
                os.environ[CONV_WORKSPACE_VARIABLE] = str(conv_workspace_cap_mb(total, evaluations))
    return {}


def serve(handlers: dict[str, Handler], argv: list[str] | None = None) -> None:
    """Worker-side main loop: read requests, dispatch on ``op``, reply. ``exit`` ends the loop."""
    args = list(sys.argv[1:] if argv is None else argv)
    fd_in = int(args[args.index("--fd-in") + 1])
    fd_out = int(args[args.index("--fd-out") + 1])
    with os.fdopen(fd_in, "rb", buffering=0) as requests:
        buffer = b""
        while True:
            while b"\n" not in buffer:
                chunk = requests.read(1 << 16)
                if not chunk:
                    return
                buffer += chunk
            line, buffer = buffer.split(b"\n", 1)
            message = json.loads(line)
            op, nonce = message.pop("op", None), message.pop("nonce", None)
            if op == "exit":
                return
            try:
                handler = handlers.get("warm", warm_device) if op == "warm" else handlers[op]
                reply = {"ok": True, **handler(message)}
            except BaseException as exc:  # noqa: BLE001 - every failure must become a reply
                if isinstance(exc, KeyboardInterrupt):
                    raise
                reply = {
                    "ok": False,
                    "error_type": type(exc).__name__,
                    "error": str(exc)[:4000],
                    "traceback": traceback.format_exc()[-8000:],
                }
            reply["nonce"] = nonce
            _write_all(fd_out, (json.dumps(reply, default=_json_default) + "\n").encode())


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__qualname__}")

"""Worker zygote: one interpreter that has imported torch and the worker modules, and forks workers.

Starting a worker as a fresh interpreter costs ~4 s of CPU (``import torch`` ~2.3 s, then
``torch._dynamo`` ~1.6 s as it warms up), and every evaluation starts two. A zygote pays that once
per evaluating process: it imports the worker modules (and nothing task- or candidate-specific: it
never sees a task, a candidate, an input or a result), then waits on a private socket. Each request forks a child that becomes the
worker exactly as an exec'd one would: its own session, stdin from /dev/null, stdout and stderr to
its log, the requested environment and working directory, the same ``preexec`` step (limits,
sandbox user, CPU placement) and then the module run as ``__main__`` (as ``python -m`` runs it) on
the request's pipe pair, with its own random seeds and a process name of its own. The child keeps
no descriptor of the zygote's (the control socket, other workers' status pipes), and no
CUDA state exists to inherit: the zygote never initialises the device.

The zygote is the worker's parent, so it reaps it and writes its exit status, in ``Popen``'s
convention, to a status pipe the evaluator holds (:class:`ForkedProcess`). It exits, killing the
workers it started, when the evaluator's end of the control socket closes (the evaluator exited or
was killed); each worker also dies with the zygote (``die_with_parent`` in every ``preexec``).

``CUDA_AGENT_WORKER_START=exec`` turns zygotes off: every worker is then a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import logging
import os
import pickle
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

PRELOADED = ("cuda_agent.environment.reference_worker", "cuda_agent.environment.candidate_worker")
"""The modules a zygote imports and can fork workers of (an evaluation's two workers)."""
_IMPORTED_AHEAD = ("torch._dynamo",)
"""What both workers import as they warm up (~1.6 s of CPU each; no thread, no device state).
(The preloaded copies of the worker modules serve their imports; each worker runs its own module
afresh as ``__main__``.)"""

_READ_WHEN_USED = frozenset({"HOME", "TMPDIR", "USER", "LOGNAME", "TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST",
                             "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
"""Environment variables nothing reads while the zygote imports (only later, when a worker builds,
writes temporary files or initialises CUDA): they may differ between the zygote and its workers.
A worker whose environment differs in any other variable gets a zygote started with its own."""

_MAX_REQUEST_BYTES = 1 << 20
_PR_SET_NAME = 15
_START_TIMEOUT_S = 300


class ForkedProcess:
    """The evaluator's handle on a worker a zygote forked: the part of ``subprocess.Popen`` that
    :class:`~cuda_agent.environment.worker.WorkerProcess` uses (``pid``, ``returncode``, ``poll``,
    ``wait``). The exit status arrives on ``status_fd``; its end without one means the zygote died,
    and its workers with it (SIGKILL)."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd = status_fd
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
        return code

    def _collect(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is None:
                ready, _, _ = select.select([self._status_fd], [], [], timeout)
                if ready:
                    data = b""
                    while chunk := os.read(self._status_fd, 64):
                        data += chunk
                    os.close(self._status_fd)
                    self.returncode = int(data) if data.strip() else -signal.SIGKILL
            return self.returncode


class Zygote:
    """The evaluator's side of one zygote: start it, ask it for workers, stop it."""

    def __init__(self, env: dict[str, str]) -> None:
        self._lock = threading.Lock()
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import main; main()", "--fd", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, cwd="/",
            start_new_session=True,
        )
        theirs.close()
        self.owner_pid = os.getpid()
        self._socket.settimeout(_START_TIMEOUT_S)
        try:
            ready = self._socket.recv(_MAX_REQUEST_BYTES)  # after the imports; empty if the zygote died
        except TimeoutError:
            ready = b""
        self._socket.settimeout(None)
        if ready != b"ready":
            self.close()
            raise OSError(f"the worker zygote did not start within {_START_TIMEOUT_S} s "
                          f"(exit status {self.proc.returncode})")

    def spawn(self, module: str, *, env: dict[str, str], cwd: Path, log_fd: int, fd_in: int, fd_out: int,
              preexec: Callable[[], None] | None) -> ForkedProcess:
        """Fork a worker running ``module`` as ``__main__`` on the pipe ends ``fd_in``/``fd_out``.
        Raises OSError if the zygote is gone (the caller may start the worker itself)."""
        status_r, status_w = os.pipe()
        request = pickle.dumps((module, env, str(cwd), preexec))
        try:
            with self._lock:
                socket.send_fds(self._socket, [request], [fd_in, fd_out, log_fd, status_w])
                reply = self._socket.recv(_MAX_REQUEST_BYTES)
        except OSError:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        if not reply.isdigit():
            os.close(status_r)
            raise OSError(f"the worker zygote could not fork: {reply.decode(errors='replace') or 'it exited'}")
        return ForkedProcess(int(reply), status_r)

    def close(self) -> None:
        """Stop the zygote: it kills the workers it started and exits."""
        self._socket.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_zygotes: dict[tuple, Zygote] = {}
_failed: set[tuple] = set()
"""Keys whose zygote did not start: their workers are exec'd from then on, not tried again."""
_zygotes_lock = threading.Lock()


def zygote_for(module: str, env: dict[str, str]) -> Zygote | None:
    """This process's zygote for workers of ``module`` with environment ``env`` (started on first
    use), or None where workers must be exec'd: a module the zygote does not preload, zygotes
    turned off, or one that failed to start."""
    if module not in PRELOADED or os.environ.get("CUDA_AGENT_WORKER_START", "fork") == "exec":
        return None
    key = tuple(sorted((k, v) for k, v in env.items() if k not in _READ_WHEN_USED))
    with _zygotes_lock:
        if key in _failed:
            return None
        zygote = _zygotes.get(key)
        if zygote is not None and zygote.owner_pid != os.getpid():
            zygote = None  # inherited across a fork of this process: the parent's, never shared
        elif zygote is not None and zygote.proc.poll() is not None:
            zygote.close()  # died (killed from outside): a new one takes its place
            zygote = None
        if zygote is None:
            try:
                zygote = _zygotes[key] = Zygote(env)
            except OSError as exc:
                logger.warning("%s; workers are started as fresh interpreters instead", exc)
                _failed.add(key)
                return None
        return zygote


def process_name(module: str) -> str:
    """The name (``comm``, 15 bytes at most) a forked worker of ``module`` runs under: its command
    line is the zygote's, so ``ps -o comm`` and ``top`` tell workers apart by this."""
    return module.rsplit(".", 1)[-1][:15]


def zygote_pids() -> list[int]:
    """This process's running zygotes: their children are this process's workers (leak checks)."""
    with _zygotes_lock:
        return [z.proc.pid for z in _zygotes.values() if z.owner_pid == os.getpid() and z.proc.poll() is None]


@atexit.register
def _stop_zygotes() -> None:
    with _zygotes_lock:
        for zygote in _zygotes.values():
            if zygote.owner_pid == os.getpid():
                zygote.close()
        _zygotes.clear()


# --- the zygote process ---------------------------------------------------------------------------


def _serve(control: socket.socket) -> None:
    """Fork a worker per request; report each one's exit status; on the control socket's end,
    kill every worker still running and return."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, int] = {}  # pid -> the write end of its status pipe
    control.send(b"ready")
    while True:
        ready, _, _ = select.select([control, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children)
        if control not in ready:
            continue
        try:
            request, fds, _, _ = socket.recv_fds(control, _MAX_REQUEST_BYTES, 4)
        except ConnectionResetError:
            request, fds = b"", []
        if not request:
            for pid in children:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            return
        fd_in, fd_out, log_fd, status_w = fds
        started_r, started_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            pid = -1
            control.send(str(exc).encode() or b"fork failed")
            os.close(status_w)
        if pid == 0:
            _become_worker(request, fd_in, fd_out, log_fd, started_w,
                           close=[control.fileno(), wake_r, wake_w, status_w, started_r, *children.values()])
        for fd in (fd_in, fd_out, log_fd, started_w):
            os.close(fd)
        if pid > 0:
            children[pid] = status_w
            os.read(started_r, 1)  # its session and preexec are in place (or it died): it can be killed by group
            control.send(str(pid).encode())
        os.close(started_r)


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status_w = children.pop(pid, None)
        if status_w is not None:
            with contextlib.suppress(OSError):
                os.write(status_w, str(os.waitstatus_to_exitcode(status)).encode())
            os.close(status_w)


def _become_worker(request: bytes, fd_in: int, fd_out: int, log_fd: int, started_w: int, close: list[int]) -> None:
    """In the forked child: turn into the worker an exec'd interpreter would be, run it, exit.
    ``started_w`` is closed once the child leads its own process group and ran ``preexec``: as
    ``Popen`` returns only after the exec, the evaluator gets the pid only then."""
    code = 1
    try:  # whatever happens, this child ends in os._exit: it never returns into the zygote's loop
        module, env, cwd, preexec = pickle.loads(request)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        os.setsid()
        ctypes.CDLL(None).prctl(_PR_SET_NAME, process_name(module).encode())
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(devnull)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # TMPDIR is this worker's
        if "numpy.random" in sys.modules:  # Python's own `random` reseeds itself in a forked child
            sys.modules["numpy.random"].seed()
        os.chdir(cwd)
        if preexec is not None:
            preexec()
        os.close(started_w)
        sys.path[0] = os.getcwd()  # as `python -m` puts the working directory first
        sys.argv = [module, "--fd-in", str(fd_in), "--fd-out", str(fd_out)]
        runpy.run_module(module, run_name="__main__", alter_sys=True)  # as `python -m`: the worker is __main__
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the log is the only place a worker's failure can go
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main() -> None:
    fd = int(sys.argv[sys.argv.index("--fd") + 1])
    # An import that asks torch.cuda.is_available() must not initialise the driver here (a forked
    # child could then not use the GPU): with this set torch answers from NVML instead.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    for module in (*PRELOADED, *_IMPORTED_AHEAD):
        importlib.import_module(module)
    if sys.modules["torch"].cuda.is_initialized():
        raise SystemExit("the worker zygote's imports initialised CUDA: its workers could not use the GPU")
    _serve(socket.socket(fileno=fd))


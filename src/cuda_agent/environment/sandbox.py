"""The candidate's sandbox: its own unprivileged user, no network, resource limits, and a clean exit.

Running as root, each evaluation leases a *slot* ``i`` and runs its candidate worker as uid
``uid_base + i`` (no passwd entry is needed), in a fresh network namespace, under
``RLIMIT_NPROC``/``RLIMIT_FSIZE``/``RLIMIT_CPU`` (on the CPU backend the candidate worker also caps
its own address space before it loads candidate code: :func:`worker.cap_address_space`). Because no
two evaluations share a uid, everything the candidate started — including daemons that left its
process group — is found and killed by uid when the evaluation ends. Files the candidate may write
are the ones the evaluator hands to that uid; the task, the inputs and every cache stay root-owned.

The interpreter and packages must stay readable to that uid. When they sit under a directory other
users cannot enter (a pyenv in ``/root``), the candidate gets a private mount namespace in which
that directory is an empty tmpfs holding bind mounts of only the needed entries: it sees the Python
installation and nothing else of root's home (caches included).

Not root, nothing can switch users: the candidate runs as the current user with the same limits
(except ``RLIMIT_NPROC``, which would count the user's own processes) and the lease says so.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cuda_agent.environment.config import LimitsConfig, SandboxConfig
from cuda_agent.environment.worker import die_with_parent

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_PR_SET_DUMPABLE = 4
_MS_BIND, _MS_REC, _MS_MOVE, _MS_PRIVATE = 4096, 16384, 8192, 1 << 18
_SLOT_DIR = Path(tempfile.gettempdir()) / "cuda-agent-sandbox-slots"
_PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
"""World-writable directories the candidate gets a private, size-limited tmpfs for: what it leaves
there vanishes with it, and it cannot fill the host's."""


class SandboxError(RuntimeError):
    """The sandbox was required (``sandbox.mode = "on"``) but cannot be set up here."""


@dataclass
class Lease:
    """One evaluation's hold on the sandbox: the uid its candidate runs as (None: not switched)."""

    uid: int | None
    isolate_network: bool
    notes: list[str] = field(default_factory=list)
    views: list[tuple[Path, list[str]]] = field(default_factory=list)
    """Directories the candidate sees as a fresh tmpfs (its private temp dirs, and directories
    closed to other users), each with the needed paths below it bind-mounted back."""
    _lock_fd: int | None = None

    def describe(self) -> str:
        if self.uid is None:
            return "off: " + "; ".join(self.notes)
        network = "own network namespace" if self.isolate_network else "host network"
        return f"uid {self.uid}, {network}" + "".join(f"; {n}" for n in self.notes)

    def give_to_candidate(self, path: Path) -> None:
        """Make ``path`` (a file or tree the evaluator created) the candidate's to write; links are
        changed themselves, never followed."""
        if self.uid is None:
            return
        for item in [path, *(path.rglob("*") if path.is_dir() else ())]:
            os.chown(item, self.uid, self.uid, follow_symlinks=False)

    def preexec(self, limits: LimitsConfig, workdir: Path) -> Callable[[], None]:
        """The function the candidate's child runs between fork and exec (as root when switching).
        In the sandbox ``workdir`` becomes a private tmpfs of ``limits.disk_mb``: a hard quota."""
        views = [(str(directory), relatives,
                  f"size={limits.disk_mb}m,mode=1777" if directory in _PRIVATE_TMP else "mode=755")
                 for directory, relatives in self.views]
        if self.uid is not None:
            views.append((str(workdir), [], f"size={limits.disk_mb}m,mode=700,uid={self.uid},gid={self.uid}"))
        return _Entry(self.uid, self.isolate_network, views, str(workdir), limits.max_file_mb * 1024 * 1024,
                      limits.cpu_s, limits.max_processes)

    def release(self) -> None:
        """Kill every process left running as the lease's uid, then free the slot."""
        if self.uid is not None:
            kill_all_processes_of(self.uid)
        lock_fd, self._lock_fd = self._lock_fd, None
        if lock_fd is not None:
            os.close(lock_fd)


@dataclass(frozen=True)
class _Entry:
    """:meth:`Lease.preexec`: data, so a worker zygote can run it in the child it forks."""

    uid: int | None
    isolate_network: bool
    views: list[tuple[str, list[str], str]]
    workdir: str
    file_bytes: int
    cpu_s: int
    max_processes: int

    def __call__(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_bytes, self.file_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s + 5))
        if self.uid is None:
            die_with_parent()
            return
        if self.isolate_network and _unshare(_CLONE_NEWNET) != 0:
            os._exit(121)  # probed by the parent before: cannot happen unless the host changed
        if self.views:
            _mount_views(self.views)
            os.chdir(self.workdir)  # the cwd the child entered is the directory under the new mount
        resource.setrlimit(resource.RLIMIT_NPROC, (self.max_processes, self.max_processes))
        os.setgroups([])
        os.setgid(self.uid)
        os.setuid(self.uid)
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1)  # as exec'ing as this uid would: /proc/self is its own
        die_with_parent()


def acquire(config: SandboxConfig, device: str, scratch: Path, reads: tuple[Path, ...] = ()) -> Lease:
    """Lease a sandbox slot for one evaluation (or explain, in the lease, why there is none).
    ``scratch`` is the evaluation's folder, which the candidate must be able to reach; ``reads``
    are more paths it must see (read-only to it by their permissions), where they exist."""
    if config.mode == "off":
        return Lease(None, False, ["sandbox.mode is 'off'"])
    problem = _cannot_switch_user(device)
    if problem:
        if config.mode == "on":
            raise SandboxError(f"sandbox.mode is 'on' but {problem}")
        return Lease(None, False, [f"{problem}: the candidate runs as the evaluating user"])
    views = _views_for([*_paths_the_candidate_reads(), scratch.resolve(), *(p.resolve() for p in reads if p.exists())])
    if isinstance(views, str):
        if config.mode == "on":
            raise SandboxError(f"sandbox.mode is 'on' but {views}")
        return Lease(None, False, [f"{views}: the candidate runs as the evaluating user"])
    uid, lock_fd = _lock_free_slot(config)
    lease = Lease(uid, False, views=views, _lock_fd=lock_fd)
    kill_all_processes_of(uid)  # leftovers of a crashed earlier holder
    if config.isolate_network:
        lease.isolate_network = _network_namespaces_work()
        if not lease.isolate_network:
            lease.notes.append("this kernel refuses new network namespaces: host network visible")
    return lease


def _cannot_switch_user(device: str) -> str | None:
    if os.geteuid() != 0:
        return "the evaluator is not running as root, so it cannot switch to a sandbox user"
    if device == "cuda":
        for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"):
            if os.path.exists(node) and (os.stat(node).st_mode & 0o006) != 0o006:
                return f"{node} is not read-writable by other users, so a sandbox user could not use the GPU"
    return None


def _paths_the_candidate_reads() -> list[Path]:
    import site

    import cuda_agent

    paths = {Path(sys.executable).resolve().parent, Path(sys.prefix), Path(sys.base_prefix),
             Path(cuda_agent.__file__).resolve().parents[1]}
    paths.update(Path(p) for p in site.getsitepackages() if Path(p).is_dir())
    return sorted(p.resolve() for p in paths)


def _traversable(path: Path) -> bool:
    return bool(path.stat().st_mode & 0o001)


def _views_for(paths: list[Path]) -> list[tuple[Path, list[str]]] | str:
    """The directories to show the candidate as a fresh tmpfs: its private temp dirs, and the
    topmost directory other users cannot enter above each needed path; with, for each, the needed
    paths below it (relative) to bind-mount back. A string says why it cannot work."""
    needed = [p for p in sorted(set(paths)) if not any(q in p.parents for q in paths)]
    for path in paths:  # nested paths travel inside their ancestor's bind mount: nothing closed between
        outer = next((q for q in needed if q == path or q in path.parents), path)
        inner = [a for a in [*reversed(path.parents), path] if outer in a.parents or a == path]
        if any(not _traversable(a) for a in inner if a != outer):
            return f"{path} is closed to other users, so a sandbox user could not read it"
    private = [d for d in _PRIVATE_TMP if d.is_dir() and not d.is_symlink()]
    views: dict[Path, list[str]] = {d: [] for d in private}
    for path in needed:
        home = next((d for d in private if d in path.parents), None)
        if home is None:
            closed = [a for a in [*reversed(path.parents), path] if not _traversable(a)]
            if not closed:
                continue
            if closed[0] == path:
                return f"{path} is closed to other users, so a sandbox user could not read it"
            home = closed[0]
        views.setdefault(home, []).append(str(path.relative_to(home)))
    return sorted(views.items())


def _mount_views(views: list[tuple[str, list[str], str]]) -> None:
    """In a private mount namespace, cover each directory with a tmpfs (mount ``options``) holding
    bind mounts of only the listed paths. Sources are opened (``O_PATH``) before the tmpfs hides
    them and bound through ``/proc/self/fd``. Child side only."""
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source: str | None, target: str, fstype: str | None, flags: int, options: str | None = None) -> None:
        if libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                      options and options.encode()) != 0:
            os._exit(122)

    if _unshare(_CLONE_NEWNS) != 0:
        os._exit(122)
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    for directory, relatives, options in views:
        sources = [os.open(os.path.join(directory, r), os.O_PATH) for r in relatives]
        mount("tmpfs", directory, "tmpfs", 0, options)
        for relative, source in zip(relatives, sources):
            inside = directory
            for part in relative.split("/"):
                inside = os.path.join(inside, part)
                os.makedirs(inside, exist_ok=True)
                os.chmod(inside, 0o755)
            mount(f"/proc/self/fd/{source}", inside, None, _MS_BIND | _MS_REC)
            os.close(source)


def _lock_free_slot(config: SandboxConfig) -> tuple[int, int]:
    _SLOT_DIR.mkdir(mode=0o700, exist_ok=True)
    start = random.randrange(config.slots)
    for k in range(config.slots):
        slot = (start + k) % config.slots
        fd = os.open(_SLOT_DIR / f"uid-{config.uid_base + slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return config.uid_base + slot, fd
    raise SandboxError(f"all {config.slots} sandbox slots are in use; raise sandbox.slots")


_netns_probe: bool | None = None


def _network_namespaces_work() -> bool:
    """Whether ``unshare(CLONE_NEWNET)`` succeeds here (probed once per process, in a child)."""
    global _netns_probe
    if _netns_probe is None:
        probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0)"
        _netns_probe = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode == 0
    return _netns_probe


def _unshare(flags: int) -> int:
    return ctypes.CDLL(None, use_errno=True).unshare(flags)


def processes_of(uid: int) -> list[int]:
    """Pids whose real uid is ``uid`` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return pids


def kill_all_processes_of(uid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL every process of ``uid``, daemons and fork bombs included.

    ``kill -KILL -1`` run *as that uid* (the system ``kill``, not Python: the uid may not be able to
    read the interpreter) reaches all of its processes in one kernel call, so a fork bomb cannot
    outrun it; repeated until /proc shows none alive (zombies are reaped by their parents).
    """
    kill = shutil.which("kill") or "/bin/kill"
    deadline = time.monotonic() + timeout_s
    while processes_of(uid) and time.monotonic() < deadline:
        subprocess.run([kill, "-KILL", "-1"], user=uid, group=uid, extra_groups=[], env={},
                       capture_output=True, timeout=30)
        live = [pid for pid in processes_of(uid) if not _is_zombie(pid)]
        if not live:
            return
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


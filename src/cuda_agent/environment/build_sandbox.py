"""Where a compile child runs: in the candidate's sandbox when the evaluator is root.

A build runs candidate code. A single-file solution is imported (its ``load_inline`` calls compile
when the module runs), native static initialisers run when an extension loads, and the compilers'
messages come back to the candidate (an ``#include`` of a file only root may read would leak it).
So, as root, the compile child runs like the candidate worker: as a leased sandbox uid, in its own
network namespace, under resource limits, in a private folder holding a root-owned copy of the
solution's files and an output folder that uid owns. The build cache stays read-only to it:

- the trusted parent copies the finished extension into the cache entry of this solution's key
  (a build can only ever write its own entry);
- the precompiled header, torch's compile flags and the launcher shim are prepared beforehand by a
  process that runs no candidate code (:func:`prepare_toolchain`), and the child only reads them;
- no compiled object is shared from a sandboxed build to another: an object made where candidate
  code runs could be made to lie, and would then serve every build of the same source.

Not root, or with ``sandbox.mode = "off"``, the child runs as the evaluating user, directly in the
cache entry, with the object cache on; the lease says why.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.environment import sandbox
from cuda_agent.environment.config import BuildConfig, Device, LimitsConfig, SandboxConfig
from cuda_agent.environment.launchers import shim_object_path
from cuda_agent.environment.owned_scratch import make_owned_dir
from cuda_agent.environment.solution import Solution
from cuda_agent.environment.timed_cpus import split_for, start_off_timed
from cuda_agent.environment.worker import child_env, die_with_parent

MAX_COPIED_BYTES = 64 * 1024 * 1024
"""A solution's files copied into a sandboxed build, at most (its sources; anything larger is a
solution error, not something to compile)."""
_BUILD_USER = "cuda-agent-build"
TOOLCHAIN_DIR = "toolchain"
"""Under the build cache: per toolchain, torch's flags and the launcher shim (see :func:`prepare_toolchain`)."""

_prepared: set[tuple[str, str]] = set()
_prepared_lock = threading.Lock()


class SolutionTooLarge(RuntimeError):
    """The solution's folder holds more than :data:`MAX_COPIED_BYTES` of files."""


@dataclass
class BuildPlace:
    """Paths and process settings of one compile child (see the module docstring)."""

    solution: Solution
    """The solution as the child sees it: the private copy when sandboxed."""
    extensions_dir: Path
    """Where the child writes the extension (the cache entry's ``ext`` when not sandboxed)."""
    result_path: Path
    spec_path: Path
    work_dir: Path
    """The child's working directory (a private size-limited tmpfs when sandboxed)."""
    preexec: Callable[[], None]
    env: dict[str, str] = field(default_factory=dict)
    lease: sandbox.Lease | None = None
    private: Path | None = None

    @property
    def sandboxed(self) -> bool:
        return self.lease is not None and self.lease.uid is not None

    def collect(self, extensions_dir: Path) -> None:
        """Copy the sandboxed child's extension into the cache entry (links are not followed:
        only regular files and folders are copied)."""
        if not self.sandboxed:
            return
        shutil.rmtree(extensions_dir, ignore_errors=True)
        _copy_regular_files(self.extensions_dir, extensions_dir, mode=None)

    def close(self) -> None:
        """Kill whatever the child left running (as its uid), free the slot, remove the folder."""
        if self.lease is not None:
            self.lease.release()
        if self.private is not None:
            shutil.rmtree(self.private, ignore_errors=True)


def open_place(solution: Solution, build_dir: Path, extensions_dir: Path, sandbox_config: SandboxConfig,
               cache_dir: Path) -> BuildPlace:
    """Where to run the compile child of ``solution`` (the caller closes it).

    Raises:
        SolutionTooLarge: the files to copy exceed :data:`MAX_COPIED_BYTES`.
        sandbox.SandboxError: ``sandbox.mode = "on"`` and the sandbox cannot be set up.
    """
    if sandbox_config.mode == "off" or os.geteuid() != 0:
        return _in_cache_entry(solution, build_dir, extensions_dir)
    private = make_owned_dir("build", _scratch_root())  # removed by the next pool if this process is killed
    try:
        private.chmod(0o711)  # the build user may enter it, not list it
        shown = (cache_dir / "pch", cache_dir / TOOLCHAIN_DIR)  # prepared by the trusted side: must exist to be shown
        for directory in shown:
            directory.mkdir(parents=True, exist_ok=True)
        lease = sandbox.acquire(sandbox_config, "cpu", private, reads=shown)
        if lease.uid is None:
            lease.release()
            shutil.rmtree(private, ignore_errors=True)
            return _in_cache_entry(solution, build_dir, extensions_dir)
        return _in_private_folder(solution, private, lease)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise


def _in_cache_entry(solution: Solution, build_dir: Path, extensions_dir: Path) -> BuildPlace:
    return BuildPlace(solution, extensions_dir, build_dir / "result.json", build_dir / "spec.json", build_dir,
                      die_with_parent)


def _in_private_folder(solution: Solution, private: Path, lease: sandbox.Lease) -> BuildPlace:
    copy_root = private / "src" / solution.root.name
    _copy_regular_files(solution.root, copy_root, mode=0o444)

    def moved(path: Path) -> Path:
        return copy_root if path == solution.root else copy_root / path.relative_to(solution.root)

    moved_solution = Solution(solution.layout, copy_root, moved(solution.model_file),
                              tuple(moved(k) for k in solution.kernel_files), solution.binding_style)
    out, work = private / "out", private / "work"
    out.mkdir(mode=0o755)
    work.mkdir(mode=0o700)
    (out / "ext").mkdir()
    lease.give_to_candidate(out)
    lease.give_to_candidate(work)
    limits = LimitsConfig()
    env = {"HOME": str(work), "TMPDIR": str(work), "USER": _BUILD_USER, "LOGNAME": _BUILD_USER}
    return BuildPlace(moved_solution, out / "ext", out / "result.json", private / "spec.json", work,
                      lease.preexec(limits, workdir=work), env, lease, private)


def _copy_regular_files(source: Path, target: Path, mode: int | None) -> None:
    """Copy ``source`` (a file or a tree) to ``target``: regular files and folders only, never a
    link's target; files get ``mode`` (root-owned, readable by all) unless it is None."""
    total = 0
    entries = [source] if source.is_file() else [source, *sorted(source.rglob("*"))]
    for entry in entries:
        info = entry.lstat()
        destination = target if entry == source else target / entry.relative_to(source)
        if stat.S_ISDIR(info.st_mode):
            destination.mkdir(mode=0o755, parents=True, exist_ok=True)
            destination.chmod(0o755)
        elif stat.S_ISREG(info.st_mode):
            total += info.st_size
            if total > MAX_COPIED_BYTES:
                raise SolutionTooLarge(f"{source}: more than {MAX_COPIED_BYTES >> 20} MB of files to build")
            destination.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(entry, destination, follow_symlinks=False)
            destination.chmod(mode if mode is not None else stat.S_IMODE(info.st_mode) & 0o755)


def _scratch_root() -> Path:
    from cuda_agent.environment.slots import default_scratch_root

    return default_scratch_root()


def toolchain_file(toolchain_dir: Path, with_cuda: bool) -> Path:
    """torch's compile and link flags for one extension kind, as the trusted side saved them."""
    return toolchain_dir / f"toolchain-{'cuda' if with_cuda else 'cpu'}.json"


def prepare_toolchain(device: Device, config: BuildConfig, cache_dir: Path, toolchain_dir: Path, *,
                      precompiled_header: bool, shim: bool) -> str:
    """Prepare what compile children only read, in a process that runs no candidate code: torch's
    flags in ``toolchain_dir`` (so no compile child imports torch to learn them), the precompiled
    ``torch/extension.h`` (``precompiled_header``: for sandboxed builds, which cannot build it)
    and the launcher shim (``shim``). Returns at once when all is there (the precompiled header:
    once per process and settings). Returns the preparing process's output ("" when none ran);
    a failure only means builds go without (the compile child then learns torch's flags itself
    and compiles without the header; a missing shim is the caller's to report).
    """
    kinds = [False] if device == "cpu" else [False, True]
    pch = precompiled_header and config.precompiled_header and config.lean
    key = (device, json.dumps([str(cache_dir), str(toolchain_dir), list(config.extra_cflags), config.cuda_arch]))
    with _prepared_lock:
        ready = (all(toolchain_file(toolchain_dir, k).is_file() for k in kinds)
                 and (not shim or shim_object_path(toolchain_dir, device == "cuda").is_file())
                 and (not pch or key in _prepared))
        if ready:
            return ""
        spec = {"cache_dir": str(cache_dir), "extra_cflags": list(config.extra_cflags), "with_cuda": kinds,
                "toolchain_dir": str(toolchain_dir), "precompiled_header": pch,
                "shim": [device == "cuda"] if shim else []}
        env = child_env({"TORCH_CUDA_ARCH_LIST": config.cuda_arch, "CUDA_VISIBLE_DEVICES": ""})
        try:
            result = subprocess.run([sys.executable, "-m", "cuda_agent.environment.build_worker", "--precompile",
                                     json.dumps(spec)], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                    text=True, timeout=config.timeout_s, check=False,
                                    preexec_fn=start_off_timed(split_for(device), die_with_parent))
        except subprocess.TimeoutExpired:
            return f"the preparation exceeded build.timeout_s ({config.timeout_s:g} s) and was killed"
        if pch:
            _prepared.add(key)
        return (result.stdout + result.stderr).strip()

"""Compiling candidates: a content-hash build cache in front of a compile child process.

The compiler runs in a separate process group with a wall-clock limit and no GPU visible
(``CUDA_VISIBLE_DEVICES=""``, explicit ``TORCH_CUDA_ARCH_LIST``), so builds can run on CPU workers
while GPUs time other candidates. Same sources + same toolchain ⇒ same key ⇒ no recompile.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.environment.compiler import compiler_was_killed
from cuda_agent.environment.build_sandbox import (
    TOOLCHAIN_DIR, BuildPlace, SolutionTooLarge, open_place, prepare_toolchain,
)
from cuda_agent.environment.launchers import shim_key, shim_object_path
from cuda_agent.environment.config import BuildConfig, Device, SandboxConfig
from cuda_agent.environment.solution import Solution
from cuda_agent.environment.timed_cpus import split_for, start_off_timed
from cuda_agent.environment.verdict import BuildInfo
from cuda_agent.environment.worker import child_env, signal_name

logger = logging.getLogger(__name__)

BUILD_OK_FILE = "BUILD_OK.json"
BUILD_FAILED_FILE = "BUILD_FAILED.json"
"""Written when the compiler rejected the sources: the same sources and toolchain fail the same way,
so a later build of that key (a pool's compile stage, then its evaluation; a resubmitted candidate)
reports the recorded error at once instead of compiling again. Timeouts are never recorded."""
BUILD_PATH_VERSION = "lean-3"
"""Changes whenever the build child's compile path does (part of every build key)."""


INFRA_RETRIES = 2
"""Further tries of a build whose compiler or build process was killed from outside (the kernel's
OOM killer, an operator): such a failure says nothing about the sources, so it is never cached."""
class CompileError(RuntimeError):
    """The candidate did not compile (or its build timed out); ``log_tail`` holds compiler output.
    ``infrastructure``: the build was killed from outside on every try, not the candidate's fault."""

    def __init__(self, message: str, log_tail: str = "", timed_out: bool = False,
                 infrastructure: bool = False) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.timed_out = timed_out
        self.infrastructure = infrastructure


@dataclass(frozen=True)
class BuiltSolution:
    """Where the candidate's compiled artefacts live, for the candidate worker to load them from."""

    solution: Solution
    build_dir: Path
    extensions_dir: Path  # TORCH_EXTENSIONS_DIR for single-file builds; holds cuda_extension.so for workdirs
    info: BuildInfo


def toolchain_fingerprint(device: Device, config: BuildConfig) -> str:
    """Everything besides the sources that changes the compiled binary."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    parts = [
        BUILD_PATH_VERSION, torch_version, sys.version, platform.machine(), device, config.cuda_arch,
        str(config.precompiled_header), str(config.lean),
        " ".join(config.extra_cflags), " ".join(config.extra_cuda_cflags),
        os.environ.get("CXX", ""), os.environ.get("CUDA_HOME", ""),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def toolchain_dir(device: Device, config: BuildConfig, cache_dir: Path) -> Path:
    """Where the trusted side keeps torch's flags and the launcher shim for this toolchain (the
    compilers' files are part of the key: an upgraded compiler gets fresh ones)."""
    compilers = [shutil.which(os.environ.get("CXX") or "c++")]
    if device == "cuda":
        cuda_home = os.environ.get("CUDA_HOME")
        compilers.append(str(Path(cuda_home) / "bin" / "nvcc") if cuda_home else shutil.which("nvcc"))
    stamps = []
    for compiler in compilers:
        try:
            real = Path(compiler).resolve() if compiler else None
            info = real.stat() if real else None
            stamps.append(f"{real}:{info.st_size}:{info.st_mtime_ns}" if info else "none")
        except OSError:
            stamps.append(f"{compiler}: missing")
    key = hashlib.sha256("\n".join([toolchain_fingerprint(device, config), *stamps]).encode()).hexdigest()
    return cache_dir / TOOLCHAIN_DIR / key[:32]


def build_key(solution: Solution, device: Device, config: BuildConfig) -> str:
    shim = shim_key() if solution.binding_style == "launcher" else ""  # linked into the module: part of it
    return hashlib.sha256((solution.content_hash() + toolchain_fingerprint(device, config) + shim).encode()).hexdigest()


def build_location(solution: Solution, device: Device, config: BuildConfig, cache_dir: Path) -> tuple[str, Path, Path]:
    """``(key, build_dir, extensions_dir)`` of a solution's build, known before building it."""
    key = build_key(solution, device, config)
    build_dir = cache_dir / "build" / key[:2] / key
    return key, build_dir, build_dir / "ext"


def require_buildable_for(solution: Solution, device: Device) -> None:
    """Refuse CUDA on the CPU backend at once: its compiler would fail only after seconds, saying
    "CUDA_HOME environment variable is not set" without naming the mismatch.

    Raises:
        CompileError: ``solution`` holds CUDA and ``device`` is ``cpu``.
    """
    cuda = solution.cuda_parts() if device == "cpu" else ()
    if cuda:
        raise CompileError(f"{solution.root.name} is a CUDA solution ({', '.join(cuda[:3])}) and the device is the "
                           "CPU, whose backend builds C++ only: judge it on device cuda (a machine with an NVIDIA GPU "
                           "and the CUDA toolkit), or write its kernels in C++")


def build_solution(solution: Solution, device: Device, config: BuildConfig, cache_dir: Path,
                   sandbox_config: SandboxConfig = SandboxConfig()) -> BuiltSolution:
    """Build ``solution`` for ``device`` unless an identical build is cached. As root, the compile
    child runs in the sandbox (``sandbox_config``, see :mod:`build_sandbox`).

    Raises:
        CompileError: compilation failed or exceeded ``config.timeout_s``, or the solution is
            CUDA and ``device`` the CPU.
    """
    require_buildable_for(solution, device)
    key, build_dir, extensions_dir = build_location(solution, device, config, cache_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key at a time; waiters then hit the cache
        if (build_dir / BUILD_OK_FILE).is_file():
            info = BuildInfo(cached=True, seconds=time.monotonic() - started, key=key)
            return BuiltSolution(solution, build_dir, extensions_dir, info)
        recorded = _read_result(build_dir / BUILD_FAILED_FILE)
        if recorded is not None:
            raise CompileError(f"{recorded['message']} (recorded by an earlier build of identical sources)",
                               recorded["log_tail"])
        try:
            place = open_place(solution, build_dir, extensions_dir, sandbox_config, cache_dir)
        except SolutionTooLarge as exc:
            raise CompileError(str(exc)) from None
        try:
            # Plain PyTorch needs no toolchain: on a fresh machine its preparation (torch's flags, the
            # precompiled header) kept a self-check's first verdict waiting 40 s on 2 cores.
            tools = (toolchain_dir(device, config, cache_dir) if solution.compiles_nothing()
                     else _prepare(solution, device, config, cache_dir, place.sandboxed))
            for attempt in range(INFRA_RETRIES + 1):
                try:
                    log_tail, compile_stats = _run_compile_child(place, device, config, build_dir, extensions_dir,
                                                                 cache_dir, tools)
                    break
                except CompileError as exc:
                    if not exc.infrastructure or attempt == INFRA_RETRIES:
                        raise
                    logger.warning("build %s: %s; trying again (%d of %d)", key[:12], exc, attempt + 1, INFRA_RETRIES)
        finally:
            place.close()
    info = BuildInfo(cached=False, seconds=time.monotonic() - started, key=key, log_tail=log_tail,
                     compile_stats=compile_stats)
    return BuiltSolution(solution, build_dir, extensions_dir, info)


def _prepare(solution: Solution, device: Device, config: BuildConfig, cache_dir: Path, sandboxed: bool) -> Path:
    """The trusted preparation of a build (:func:`build_sandbox.prepare_toolchain`); returns the
    toolchain folder.

    Raises:
        CompileError: the launcher shim a ``launcher``-style workdir needs could not be built (an
            infrastructure fault: the shim is the harness's code).
    """
    tools = toolchain_dir(device, config, cache_dir)
    shim = solution.binding_style == "launcher"
    output = prepare_toolchain(device, config, cache_dir, tools, precompiled_header=sandboxed, shim=shim)
    if shim and not shim_object_path(tools, device == "cuda").is_file():
        raise CompileError("the harness's launcher shim could not be built", _tail(output, config.log_tail_lines),
                           infrastructure=True)
    return tools


def _run_compile_child(place: BuildPlace, device: Device, config: BuildConfig, build_dir: Path,
                       extensions_dir: Path, cache_dir: Path, tools: Path) -> tuple[str, dict[str, int]]:
    if extensions_dir.exists():  # leftovers of a failed or killed build
        shutil.rmtree(extensions_dir)
    extensions_dir.mkdir()
    place.result_path.unlink(missing_ok=True)
    solution = place.solution
    spec = {
        "layout": solution.layout.value,
        "root": str(solution.root),
        "model_file": str(solution.model_file),
        "kernel_files": [str(p) for p in solution.kernel_files],
        "binding_names": list(solution.binding_names),
        "binding_style": solution.binding_style,
        "device": device,
        "extensions_dir": str(place.extensions_dir),
        "extra_cflags": list(config.extra_cflags),
        "extra_cuda_cflags": list(config.extra_cuda_cflags),
        "result_path": str(place.result_path),
        "cache_dir": str(cache_dir),  # objects and precompiled headers live beside build/
        "toolchain_dir": str(tools),  # torch's flags and the launcher shim, prepared by the trusted side
        "shim_object": str(shim_object_path(tools, device == "cuda")),
        "sandboxed": place.sandboxed,  # see build_sandbox: objects made where candidate code runs stay private
        "jobs": config.max_jobs or os.cpu_count() or 1,
        "pch": config.precompiled_header,
        "lean": config.lean,
    }
    place.spec_path.unlink(missing_ok=True)
    place.spec_path.write_text(json.dumps(spec))
    place.spec_path.chmod(0o444)  # read-only to the build user
    env = child_env({
        "TORCH_EXTENSIONS_DIR": str(place.extensions_dir),
        "TORCH_CUDA_ARCH_LIST": config.cuda_arch,
        "MAX_JOBS": str(config.max_jobs or os.cpu_count() or 1),
        "CUDA_VISIBLE_DEVICES": "",
        **place.env,
    })
    log_path = build_dir / "build.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cuda_agent.environment.build_worker", str(place.spec_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, cwd=place.work_dir, start_new_session=True,
            preexec_fn=start_off_timed(split_for(device), place.preexec),  # off the CPUs set apart for timing
        )
        try:
            proc.wait(timeout=config.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise CompileError(
                f"build exceeded its {config.timeout_s:g} s limit and was killed",
                _tail(log_path.read_text(errors="replace"), config.log_tail_lines),
                timed_out=True,
            ) from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    log_text = log_path.read_text(errors="replace")
    result = _read_result(place.result_path)
    if result is not None and result.get("compile_error"):
        log_tail = _tail(str(result["compile_error"]), config.log_tail_lines)
        if compiler_was_killed(str(result["compile_error"])):
            raise CompileError("the compiler was killed (out of memory, or by an operator)", log_tail,
                               infrastructure=True)
        (build_dir / BUILD_FAILED_FILE).write_text(json.dumps({"message": "compilation failed", "log_tail": log_tail}))
        raise CompileError("compilation failed", log_tail)
    if proc.returncode == -signal.SIGKILL:  # the OOM killer or an operator; a crash of candidate code is another signal
        raise CompileError("the build process was killed by SIGKILL", _tail(log_text, config.log_tail_lines),
                           infrastructure=True)
    if proc.returncode < 0:
        # Killed by a signal with no failed compile recorded: module-level candidate code crashed
        # while being imported. Not a compile error; the candidate worker's import will report it.
        result = {"import_error": f"build process {signal_name(proc.returncode)} while importing the solution"}
    elif result is None or proc.returncode != 0:  # the build child itself failed: nothing to cache
        raise CompileError(f"build process exited ({proc.returncode}) without a result", _tail(log_text, config.log_tail_lines))
    place.collect(extensions_dir)
    (build_dir / BUILD_OK_FILE).write_text(json.dumps({"import_error": result.get("import_error")}))
    return _tail(log_text, config.log_tail_lines), _compile_stats(result)


def _compile_stats(result: dict) -> dict[str, int]:
    """The child's counters (it is untrusted: anything but small integers is dropped)."""
    stats = result.get("compile_stats")
    if not isinstance(stats, dict):
        return {}
    return {str(k): v for k, v in stats.items() if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31}


def _read_result(path: Path) -> dict | None:
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return result if isinstance(result, dict) else None


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def build_many(solutions: list[Solution], device: Device, config: BuildConfig, cache_dir: Path,
               max_parallel: int | None = None, on_done=None,
               sandbox_config: SandboxConfig = SandboxConfig()) -> dict[Path, BuildInfo | CompileError]:
    """Build several solutions concurrently (compilation needs CPU cores, not the GPU).

    Fills the build cache so that later evaluations of these solutions start with a cache hit.
    ``on_done(solution)`` is called as each build finishes (for progress bars).

    Returns:
        For each solution root, its ``BuildInfo`` or the ``CompileError`` it raised.
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed

    parallel = max_parallel or max(1, (os.cpu_count() or 2) // 2)
    results: dict[Path, BuildInfo | CompileError] = {}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(build_solution, s, device, config, cache_dir, sandbox_config): s for s in solutions}
        for future in as_completed(futures):
            solution = futures[future]
            try:
                results[solution.root] = future.result().info
            except CompileError as exc:
                results[solution.root] = exc
            if on_done is not None:
                on_done(solution)
    return results

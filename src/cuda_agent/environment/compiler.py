"""The lean compile path of the protected build: one extension from translation units, fast.

torch's JIT builder recompiles ``torch/extension.h`` (tens of seconds of front end) in every
translation unit of every candidate. This driver keeps torch's exact compiler flags (read from
torch's own build-file writer, so ABI settings match the installed torch) and adds:

- a precompiled ``torch/extension.h`` (GCC PCH), built once per toolchain and flag set, used by
  every C++ unit whose first include is that header;
- an object cache: a unit's object is reused when its text, the headers it can include, its flags
  and the toolchain are unchanged (an agent editing its ``.cu`` keeps its binding's object);
- all units compiled in parallel, for the configured GPU architecture only; device code keeps the
  flags the candidate and the build config give (``-O3``), never fast-math;
- nvcc's host and device front ends run side by side (:mod:`nvcc_phases`).

Runs in the compile child only (no GPU needed).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.environment.nvcc_phases import PhaseFailed, compile_cu

PCH_HEADER = "torch/extension.h"
COMPILE_STATS = ("units", "object_cache_hits", "pch_units", "phased_cuda_units")
"""Counters a build reports: units compiled or taken from the object cache, units that used the
precompiled header, CUDA units compiled with the front ends in parallel."""
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
_HEADER_SUFFIXES = (".h", ".hpp", ".cuh", ".hh", ".inl")


_KILLED_COMPILER = re.compile(
    r"^(?:\S*/)?(?:c\+\+|g\+\+|gcc|cc|clang\+\+|[\w.-]+-g\+\+(?:-\d+)?): fatal error: Killed signal terminated program"
    r"|^nvcc error\s*: '\w+' died due to signal 9|failed \(exit -9\):$", re.M)
"""A compiler killed by SIGKILL, as gcc's driver, nvcc or our own compile step report it; each
pattern anchors on text the toolchain prints at a line start, which a source's ``#error`` cannot."""


def compiler_was_killed(output: str) -> bool:
    """Whether compiler output says the compiler was killed from outside (the OOM killer, an
    operator): a failure that says nothing about the sources."""
    return _KILLED_COMPILER.search(output) is not None


class BuildFailed(RuntimeError):
    """A compiler or the linker failed; the message holds its command and output."""


@dataclass(frozen=True)
class Toolchain:
    """Compilers and torch's flags for one extension kind (with or without CUDA)."""

    cxx: str
    nvcc: str | None
    cflags: tuple[str, ...]  # torch's C++ flags, without TORCH_EXTENSION_NAME
    cuda_cflags: tuple[str, ...]  # torch's nvcc flags (one -gencode per TORCH_CUDA_ARCH_LIST entry)
    ldflags: tuple[str, ...]
    fingerprint: str  # compiler versions and flags: part of every cache key
    cxx_fingerprint: str  # the C++ compiler's version and flags only: the precompiled header's key


@dataclass(frozen=True)
class Unit:
    """One translation unit and the flags it adds to torch's (``-O3``, the candidate's own)."""

    source: Path
    flags: tuple[str, ...]

    @property
    def is_cuda(self) -> bool:
        return self.source.suffix == ".cu"


def save_toolchain(toolchain: Toolchain, path: Path) -> None:
    """Write ``toolchain`` for compile children to read instead of importing torch (atomic)."""
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(dataclasses.asdict(toolchain)))
    os.replace(partial, path)


def load_toolchain(path: Path) -> Toolchain | None:
    """A toolchain :func:`save_toolchain` wrote, or None when there is none (or it is unreadable)."""
    try:
        fields = json.loads(path.read_text())
        return Toolchain(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    except (OSError, ValueError, TypeError):
        return None


def torch_toolchain(with_cuda: bool) -> Toolchain:
    """torch's compile and link flags, read from the build file torch itself would write."""
    import torch.utils.cpp_extension as cpp_extension

    with tempfile.TemporaryDirectory(prefix="cuda-agent-flags-") as tmp:
        sources = [str(Path(tmp) / "a.cpp")] + ([str(Path(tmp) / "b.cu")] if with_cuda else [])
        ldflags = cpp_extension._prepare_ldflags([], with_cuda, False, False, False) if _takes_sycl() else \
            cpp_extension._prepare_ldflags([], with_cuda, False, False)
        writer = cpp_extension._write_ninja_file_to_build_library
        arguments = dict(path=str(Path(tmp) / "build.ninja"), name="_name_", sources=sources, extra_cflags=[],
                         extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=ldflags, extra_include_paths=[],
                         with_cuda=with_cuda, with_sycl=False, is_standalone=False)
        accepted = inspect.signature(writer).parameters
        writer(**{k: v for k, v in arguments.items() if k in accepted})
        variables = _ninja_variables((Path(tmp) / "build.ninja").read_text())
    name_flag = "-DTORCH_EXTENSION_NAME=_name_"
    cflags = tuple(f for f in shlex.split(variables.get("cflags", "") + " " + variables.get("post_cflags", ""))
                   if f != name_flag)
    cuda_cflags = tuple(f for f in shlex.split(variables.get("cuda_cflags", "") + " "
                                               + variables.get("cuda_post_cflags", "")) if f != name_flag)
    cxx, nvcc = variables.get("cxx", "c++"), variables.get("nvcc") if with_cuda else None
    versions = [_version_of(cxx)] + ([_version_of(nvcc)] if nvcc else [])
    fingerprint = hashlib.sha256("\n".join([*versions, *cflags, "|", *cuda_cflags, "|",
                                            *variables.get("ldflags", "").split()]).encode()).hexdigest()
    cxx_fingerprint = hashlib.sha256("\n".join([versions[0], *cflags]).encode()).hexdigest()
    return Toolchain(cxx, nvcc, cflags, cuda_cflags, tuple(shlex.split(variables.get("ldflags", ""))), fingerprint,
                     cxx_fingerprint)


def _takes_sycl() -> bool:
    import torch.utils.cpp_extension as cpp_extension

    return "with_sycl" in inspect.signature(cpp_extension._prepare_ldflags).parameters


def _ninja_variables(text: str) -> dict[str, str]:
    variables = {}
    for line in text.splitlines():
        if " = " in line and not line.startswith((" ", "\t", "rule", "build")):
            key, value = line.split(" = ", 1)
            variables[key.strip()] = value.strip()
    return variables


def _version_of(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{compiler}: {exc}"


def first_include(text: str) -> str | None:
    """The first ``#include``d name of a C++ file, if nothing but comments, blank lines and
    ``#pragma once`` precede it (only then can a precompiled header stand in for it)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    for line in text.splitlines():
        stripped = line.split("//", 1)[0].strip()
        if not stripped or re.fullmatch(r"#\s*pragma\s+once", stripped):
            continue
        match = _INCLUDE.match(stripped)
        return match.group(1) if match else None
    return None


class ExtensionCompiler:
    """Compiles units into objects (cached) and links them into one Python extension module."""

    def __init__(self, toolchain: Toolchain, cache_dir: Path, jobs: int, pch_flags: tuple[str, ...] | None, *,
                 sandboxed: bool = False) -> None:
        """``pch_flags``: the unit flags the precompiled header is built for (units with other
        flags compile without it); None disables it. Objects are reused and stored under
        ``<cache>/objects`` and a missing precompiled header is built, unless ``sandboxed``: the
        cache is read-only to a sandboxed build and its objects stay private (see :mod:`build_sandbox`)."""
        self.toolchain, self.cache_dir, self.jobs, self.pch_flags = toolchain, cache_dir, max(1, jobs), pch_flags
        self.sandboxed = sandboxed
        self.log: list[str] = []
        self.stats = dict.fromkeys(COMPILE_STATS, 0)
        self._stats_lock = threading.Lock()

    def build(self, name: str, units: list[Unit], out_dir: Path, include_dirs: tuple[Path, ...] = (),
              extra_ldflags: tuple[str, ...] = ()) -> Path:
        """Compile ``units`` and link ``out_dir/<name>.so``; returns its path.

        Raises:
            BuildFailed: a compile or the link failed (message: command and compiler output).
        """
        return self.link(name, self.compile(name, units, out_dir, include_dirs), out_dir, extra_ldflags)

    def compile(self, name: str, units: list[Unit], out_dir: Path, include_dirs: tuple[Path, ...] = (),
                prefix: str = "") -> list[Path]:
        """The objects of ``units`` in ``out_dir`` (compiled in parallel, or from the object cache);
        ``prefix`` keeps their names apart from another call's into the same folder.

        Raises:
            BuildFailed: a compile failed (the first failing unit in ``units``' order).
        """
        out_dir.mkdir(parents=True, exist_ok=True)
        pch_dir = self.precompiled_header_dir() if any(self._uses_pch(u) for u in units) else None
        with ThreadPoolExecutor(max_workers=min(self.jobs, max(1, len(units)))) as pool:
            stems = [out_dir / f"{prefix}{i}_{u.source.name}" for i, u in enumerate(units)]  # unique per unit
            return list(pool.map(lambda u, stem: self._object(name, u, stem, include_dirs, pch_dir), units, stems))

    def link(self, name: str, objects: list[Path], out_dir: Path, extra_ldflags: tuple[str, ...] = ()) -> Path:
        """``out_dir/<name>.so`` from ``objects``, with torch's link flags.

        Raises:
            BuildFailed: the link failed.
        """
        library = out_dir / f"{name}.so"
        run_step([self.toolchain.cxx, *map(str, objects), *self.toolchain.ldflags, *extra_ldflags, "-o", str(library)],
                 "link", self.log)
        return library

    # -- objects ---------------------------------------------------------------------------------
    def _uses_pch(self, unit: Unit) -> bool:
        return (self.pch_flags is not None and not unit.is_cuda and unit.flags == self.pch_flags
                and first_include(unit.source.read_text(errors="replace")) == PCH_HEADER)

    def _count(self, stat: str, amount: int = 1) -> None:
        with self._stats_lock:
            self.stats[stat] += amount

    def _object(self, name: str, unit: Unit, stem: Path, include_dirs: tuple[Path, ...],
                pch_dir: Path | None) -> Path:
        """``stem.o`` for ``unit`` (``stem``: a path unique to the unit in this build)."""
        use_pch = pch_dir is not None and self._uses_pch(unit)
        command = self._command(name, unit, include_dirs, pch_dir if use_pch else None, stem.parent)
        key = self._object_key(unit, command, include_dirs)
        cached = self.cache_dir / "objects" / key[:2] / f"{key}.o" if not self.sandboxed else None
        target = stem.with_name(stem.name + ".o")
        self._count("units")
        if cached is not None and cached.is_file():
            self._count("object_cache_hits")
            shutil.copyfile(cached, target)
            return target
        self._count("pch_units", use_pch)
        phases_dir = stem.with_name(stem.name + ".phases")
        if not (unit.is_cuda and self._compile_cu_in_phases(command, unit, target, phases_dir)):
            run_step([*command, "-c", str(unit.source), "-o", str(target)], f"compile {unit.source.name}", self.log)
        if cached is None:
            return target
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.{id(unit)}.tmp")
        shutil.copyfile(target, partial)
        os.replace(partial, cached)  # atomic: a concurrent build reads a whole object or none
        return target

    def _compile_cu_in_phases(self, command: list[str], unit: Unit, target: Path, work_dir: Path) -> bool:
        try:
            done = compile_cu(command, unit.source, target, work_dir, self.log)
        except PhaseFailed as exc:
            raise BuildFailed(f"compile {unit.source.name} failed: {exc}") from None
        self._count("phased_cuda_units", done)
        return done

    def _command(self, name: str, unit: Unit, include_dirs: tuple[Path, ...], pch_dir: Path | None,
                 out_dir: Path) -> list[str]:
        includes = [f"-I{d}" for d in include_dirs]
        if unit.is_cuda:
            if self.toolchain.nvcc is None:
                raise BuildFailed(f"{unit.source.name}: a .cu file, but this torch has no CUDA toolchain")
            return [self.toolchain.nvcc, f"-DTORCH_EXTENSION_NAME={name}", *includes, *self.toolchain.cuda_cflags,
                    *unit.flags]
        if pch_dir is None:
            return [self.toolchain.cxx, f"-DTORCH_EXTENSION_NAME={name}", *includes, *self.toolchain.cflags,
                    *unit.flags]
        # The PCH must come first and be built under the same macros: the extension's name is
        # defined by a second forced include, after it.
        name_header = out_dir / f"{name}_extension_name.h"
        name_header.write_text(f"#define TORCH_EXTENSION_NAME {name}\n")
        return [self.toolchain.cxx, f"-I{pch_dir}", *includes, *self.toolchain.cflags, *unit.flags, "-Winvalid-pch",
                "-include", PCH_HEADER, "-include", str(name_header)]

    def _object_key(self, unit: Unit, command: list[str], include_dirs: tuple[Path, ...]) -> str:
        """Hash of what decides the object: the toolchain, the command (with this build's own
        folders left out, they differ per build), the unit's text and every header it may include
        from the kernel folders."""
        build_paths = {str(d) for d in include_dirs}
        digest = hashlib.sha256(self.toolchain.fingerprint.encode())
        for part in command:
            if not any(p in part for p in build_paths) and not part.endswith("_extension_name.h"):
                digest.update(part.encode() + b"\0")
        digest.update(unit.source.name.encode() + b"\0" + unit.source.read_bytes())
        for header in _local_headers(unit.source, include_dirs):
            digest.update(b"\0" + str(header.name).encode() + b"\0" + header.read_bytes())
        return digest.hexdigest()

    # -- precompiled header ----------------------------------------------------------------------
    def precompiled_header_dir(self) -> Path | None:
        """``<cache>/pch/<key>/`` holding ``torch/extension.h.gch`` (built here on first use, under
        a lock, unless ``sandboxed``) beside the wrapper header it was compiled from; None when it is
        missing and cannot be built."""
        assert self.pch_flags is not None
        key = hashlib.sha256((self.toolchain.cxx_fingerprint + "\0".join(self.pch_flags)).encode()).hexdigest()[:32]
        directory = self.cache_dir / "pch" / key
        gch = directory / (PCH_HEADER + ".gch")
        if gch.is_file():
            return directory
        if self.sandboxed:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if gch.is_file():
                return directory
            # The header the units find first is a guarded wrapper of torch's (a PCH of torch's own
            # file would be compiled as a main file holding `#pragma once`).
            wrapper = directory / PCH_HEADER
            wrapper.parent.mkdir(parents=True, exist_ok=True)
            wrapper.write_text(f"#ifndef CUDA_AGENT_PCH_{key}\n#define CUDA_AGENT_PCH_{key}\n"
                               f'#include "{_torch_header(PCH_HEADER)}"\n#endif\n')
            partial = gch.with_suffix(".gch.tmp")
            try:
                run_step([self.toolchain.cxx, *self.toolchain.cflags, *self.pch_flags, "-x", "c++-header", str(wrapper),
                      "-o", str(partial)], "precompile torch/extension.h", self.log)
            except BuildFailed:
                partial.unlink(missing_ok=True)
                return None  # compile without it
            os.replace(partial, gch)
        return directory


def _torch_header(relative: str) -> Path:
    from torch.utils.cpp_extension import include_paths

    for directory in include_paths():
        if (Path(directory) / relative).is_file():
            return Path(directory) / relative
    raise BuildFailed(f"{relative} not found in torch's include paths")


def _local_headers(source: Path, include_dirs: tuple[Path, ...]) -> list[Path]:
    """Files in the kernel folders ``source`` may include: every header there, and any other file
    named by an ``#include`` in ``source`` or in those headers."""
    folders = [source.parent, *include_dirs]
    headers = {p for d in folders if d.is_dir() for p in d.rglob("*") if p.is_file() and p.suffix in _HEADER_SUFFIXES}
    named: set[Path] = set()
    for text_of in [source, *headers]:
        for include in _INCLUDE.findall(text_of.read_text(errors="replace")):
            named.update(d / include for d in folders if (d / include).is_file())
    return sorted(headers | named)


def run_step(command: list[str], what: str, log: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    output = (result.stdout + result.stderr).strip()
    if output:
        log.append(f"[{what}]\n{output}")
    if result.returncode != 0:
        raise BuildFailed(f"{what} failed (exit {result.returncode}):\n{shlex.join(command)}\n{output}")

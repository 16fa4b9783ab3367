"""The fast workdir contract: ``kernels/`` export plain C launchers, a pre-built shim is the glue.

A workdir whose kernel units include ``<cuda_agent_launcher.h>`` (and have no ``*_binding.cpp``)
compiles no torch header at all: each unit includes CUDA's or the C++ standard headers and this
harness header, and exports ``extern "C" int NAME(cuda_agent_call*)`` launchers. The protected
build compiles those units, lists the launchers they export (``nm``), compiles a table of them
(plain C++, no includes) and links the units, the table and the launcher shim into the
``cuda_extension`` module. The shim (``native/launcher_shim.cpp``: torch's Python tensor API, the
CUDA stream, the module definition) is compiled once per toolchain by the trusted side
(:func:`build_shim_object`, run where no candidate code runs), kept in the build cache, and only
read by builds. The header and the shim are the harness's: a workdir's own copy of the header is
never on the include path before the harness's, and the shim's source is not the candidate's.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
from pathlib import Path

from cuda_agent.environment.compiler import BuildFailed, Toolchain, run_step

LAUNCHER_HEADER = "cuda_agent_launcher.h"
NATIVE_DIR = Path(__file__).with_name("native")
"""The harness's header and shim source (read-only package files)."""
_SHIM_SOURCE = NATIVE_DIR / "launcher_shim.cpp"
_INCLUDES_HEADER = re.compile(rf"^\s*#\s*include\s*<{re.escape(LAUNCHER_HEADER)}>", re.MULTILINE)
_LAUNCHER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
"""Exported C names that can be launchers: C identifiers not reserved to the implementation
(which also leaves out C++ names, mangled to ``_Z...``, and nvcc's own ``__cuda...`` symbols)."""
COMPILED_SUFFIXES = (".cu", ".cpp", ".cc")


def includes_launcher_header(text: str) -> bool:
    """Whether a kernel unit's text includes the harness's launcher header."""
    return _INCLUDES_HEADER.search(text) is not None


def uses_launchers(kernel_files: tuple[Path, ...] | list[Path]) -> bool:
    """Whether a workdir's kernel units follow the fast contract (one includes the harness header)."""
    return any(p.suffix in COMPILED_SUFFIXES and includes_launcher_header(p.read_text(errors="replace"))
               for p in kernel_files)


def shim_key() -> str:
    """Hash of the shim's sources (part of the shim object's name: an edited shim is rebuilt)."""
    digest = hashlib.sha256(_SHIM_SOURCE.read_bytes())
    digest.update((NATIVE_DIR / LAUNCHER_HEADER).read_bytes())
    return digest.hexdigest()[:16]


def shim_object_path(toolchain_dir: Path, with_cuda: bool) -> Path:
    """Where the trusted side keeps the shim object for a toolchain (see :func:`build_shim_object`)."""
    return toolchain_dir / f"launcher-shim-{'cuda' if with_cuda else 'cpu'}-{shim_key()}.o"


def build_shim_object(toolchain: Toolchain, target: Path, log: list[str]) -> None:
    """Compile the shim for ``toolchain`` to ``target`` unless it is there (under a lock, atomic).

    Raises:
        BuildFailed: the shim did not compile (its compiler output in the message).
    """
    if target.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        defines = ["-DCUDA_AGENT_SHIM_CUDA"] if toolchain.nvcc else []
        try:
            run_step([toolchain.cxx, *toolchain.cflags, "-O2", *defines, f"-I{NATIVE_DIR}", "-c", str(_SHIM_SOURCE),
                      "-o", str(partial)], "compile the launcher shim", log)
        except BuildFailed:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, target)


def exported_launchers(objects: list[Path]) -> list[str]:
    """The launchers the kernel objects export: their global functions with C names.

    Raises:
        BuildFailed: ``nm`` could not read an object.
    """
    names: list[str] = []
    for obj in objects:
        result = subprocess.run(["nm", "--defined-only", "--extern-only", "--format=posix", str(obj)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildFailed(f"nm {obj.name} failed (exit {result.returncode}):\n{result.stderr.strip()}")
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1] == "T" and _LAUNCHER_NAME.fullmatch(parts[0]):
                names.append(parts[0])
    return sorted(set(names))


def launcher_table_source(names: list[str]) -> str:
    """The table unit the shim reads: each launcher's name and address (it includes the harness
    header alone: it compiles in a fraction of a second)."""
    declarations = "\n".join(f'extern "C" int {n}(cuda_agent_call*);' for n in names)
    entries = "\n".join(f'    {{"{n}", &{n}}},' for n in names)
    return (f"// Generated by cuda-agent's protected build: the launchers kernels/ export.\n"
            f"#include <{LAUNCHER_HEADER}>\n\n{declarations}\n\n"
            f'extern "C" const cuda_agent_launcher_entry cuda_agent_launchers[] = {{\n{entries}\n}};\n'
            f'extern "C" const int cuda_agent_launcher_count = {len(names)};\n')

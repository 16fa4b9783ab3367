"""An episode's directory: the agent's workdir seeded from a task, and the trusted parts around it.

Layout of one episode root (root-owned when running as root)::

    <root>/workdir/          the agent's cwd: model.py, model_new.py, kernels/, SKILL.md,
                             cuda_agent_launcher.h (the fast contract's header, for reading: builds
                             compile the harness's own copy), build, verify, profile (protected:
                             read-only, owned by the evaluator)
    <root>/eval.sock         the episode's evaluation service (the protected commands talk to it)
    <root>/home/             mount point of the shell's private $HOME (a fresh tmpfs per command)
    <root>/snapshots/<n>/    trusted copies of the solution files, one per evaluation

With ``style="paper"`` the workdir is the CUDA Agent paper's released layout instead: ``SKILL.md``
is the text the user supplies (cuda-agent ships none of it), ``binding.cpp`` and
``binding_registry.h`` are the harness's registry (:mod:`cuda_agent.environment.binding_registry`),
and ``utils/compile.sh`` (with ``utils/compile.py``), ``utils/verification.py`` and
``utils/profiling.py`` are the protected commands, each asking the evaluator to build, verify or
profile, as ``./build``, ``./verify`` and ``./profile`` do in the default layout.

The agent changes files through the tools (checked here: inside the workdir, no symlinks leading
out, never a protected file) and through the sandboxed shell (where file ownership enforces the
same). Evaluations never read the workdir in place: :meth:`Workdir.snapshot` copies regular files
only (symlinks are skipped), so what is judged cannot change while it is judged.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from cuda_agent.environment.binding_registry import MODULE_SOURCE as REGISTRY_MODULE_SOURCE
from cuda_agent.environment.binding_registry import REGISTRY_HEADER
from cuda_agent.environment.launchers import LAUNCHER_HEADER, NATIVE_DIR
from cuda_agent.environment.solution import (EXTENSION_NAME, KERNEL_SUFFIXES, KERNELS_DIR, REGISTRY_FILES,
                                             WORKDIR_MODEL_FILE)
from cuda_agent.environment.task import Task

REFERENCE_FILE = "model.py"
SKILL_FILE = "SKILL.md"
PROTECTED_COMMANDS = ("build", "verify", "profile")
PROTECTED_FILES = frozenset({REFERENCE_FILE, SKILL_FILE, LAUNCHER_HEADER, *PROTECTED_COMMANDS})
PAPER_COMMANDS = {"utils/compile.py": "build", "utils/verification.py": "verify", "utils/profiling.py": "profile"}
"""The paper layout's protected scripts and the evaluation each asks for (``utils/compile.sh`` runs
``utils/compile.py``)."""
PAPER_PROTECTED_FILES = frozenset({REFERENCE_FILE, SKILL_FILE, *REGISTRY_FILES, *PAPER_COMMANDS, "utils/compile.sh",
                                   "utils/__init__.py", "utils"})
WORKDIR_STYLES = ("default", "paper")
MAX_SOLUTION_FILE_BYTES = 1 << 20
"""Files above this are left out of a snapshot (the guards would reject them anyway)."""

STARTER_MODEL_NEW = '''"""Your solution: ModelNew computes what Model in model.py computes, with your own kernel.

See SKILL.md for the layouts (kernels/ launchers + `import cuda_extension`, or one file with load_inline).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("write your kernel, then call it here")
'''

_CLIENT = '''#!{python} -IS
"""Protected: asks the cuda-agent evaluator to {op} this workdir's solution (a snapshot of
model_new.py and kernels/ taken now) and prints its verdict. Exit status 0: passed, 1: failed."""
import json, os, socket, sys

os.chdir(os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), {up!r})))
channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    channel.connect("eval.sock")
except OSError as exc:
    sys.exit(f"{op}: the evaluation service is not reachable ({{exc}})")
channel.sendall(json.dumps({{"op": "{op}"}}).encode() + b"\\n")
reply = json.loads(b"".join(iter(lambda: channel.recv(1 << 16), b"")) or b"{{}}")
sys.stdout.write(reply.get("text", "{op}: no reply from the evaluation service\\n"))
sys.exit(reply.get("exit_code", 1))
'''


class WorkdirPathError(ValueError):
    """A tool asked for a path it may not use; the message says why and what to do instead."""


@dataclass(frozen=True)
class Workdir:
    """The directories of one episode (see the module docstring)."""

    root: Path
    style: str = "default"
    """``default`` (cuda-agent's layout) or ``paper`` (the released workdir's; see the module docstring)."""

    @property
    def protected(self) -> frozenset[str]:
        """Workdir-relative paths the agent may read but not write."""
        return PAPER_PROTECTED_FILES if self.style == "paper" else PROTECTED_FILES

    @property
    def path(self) -> Path:
        return self.root / "workdir"

    @property
    def bin_dir(self) -> Path | None:
        """Commands put before ``$PATH`` in the shell: the paper style's ``sudo`` (the released
        SKILL.md runs the utils with ``sudo``; in the sandbox it runs them as the sandbox uid)."""
        return self.root / "bin" if self.style == "paper" else None

    @property
    def socket_path(self) -> Path:
        return self.root / "eval.sock"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @classmethod
    def create(cls, root: Path, task: Task, style: str = "default", skill: str | None = None) -> Workdir:
        """Lay out a fresh episode root at ``root`` (absent or empty) for ``task`` in ``style``;
        ``skill`` is the SKILL.md text (default: the packaged one; required for ``paper``)."""
        if style not in WORKDIR_STYLES:
            raise ValueError(f"unknown workdir style {style!r}; valid: {', '.join(WORKDIR_STYLES)}")
        if style == "paper" and skill is None:
            raise ValueError("the paper workdir style needs the released SKILL.md text (agent.skill_path); "
                             "cuda-agent does not ship it")
        workdir = cls(root, style)
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)  # the sandbox uid must reach the workdir and the socket
        for directory in (workdir.path, workdir.home, root / "snapshots", workdir.path / KERNELS_DIR):
            directory.mkdir(mode=0o755)
        _write_protected(workdir.path / REFERENCE_FILE, task.code, 0o444)
        _write_protected(workdir.path / SKILL_FILE, skill if skill is not None else skill_text(), 0o444)
        if style == "paper":
            _lay_out_paper_files(workdir.path)
            workdir.bin_dir.mkdir(mode=0o755)
            _write_protected(workdir.bin_dir / "sudo", '#!/bin/bash\nexec "$@"\n', 0o555)
        else:
            _write_protected(workdir.path / LAUNCHER_HEADER, (NATIVE_DIR / LAUNCHER_HEADER).read_text(), 0o444)
            for op in PROTECTED_COMMANDS:
                _write_protected(workdir.path / op, _CLIENT.format(python=sys.executable, op=op, up=".."), 0o555)
        (workdir.path / WORKDIR_MODEL_FILE).write_text(STARTER_MODEL_NEW)
        return workdir

    def hand_to(self, uid: int) -> None:
        """Let ``uid`` (the sandboxed shell) create files in the workdir and edit the solution,
        while the protected files stay the evaluator's: the workdir becomes group-writable for
        ``uid``'s group with the sticky bit, so nobody but the owner may delete or rename a file."""
        os.chown(self.path, 0, uid)
        self.path.chmod(0o1775)
        for item in [self.path / WORKDIR_MODEL_FILE, self.path / KERNELS_DIR, *(self.path / KERNELS_DIR).rglob("*")]:
            os.chown(item, uid, uid, follow_symlinks=False)

    def resolve(self, relative: str, for_write: bool) -> Path:
        """The absolute path a tool may use for ``relative`` (relative to the workdir, or absolute
        inside it).

        Raises:
            WorkdirPathError: the path leaves the workdir (also through a symlink), or is a
                protected file and ``for_write`` is set.
        """
        if not relative or "\0" in relative:
            raise WorkdirPathError("empty or invalid path; give a path relative to the workdir, e.g. kernels/relu.cu")
        base = os.path.realpath(self.path)
        candidate = os.path.realpath(os.path.join(base, relative))
        if candidate != base and not candidate.startswith(base + os.sep):
            raise WorkdirPathError(f"{relative}: outside the workdir (symlinks are followed); only files under "
                                   f"{self.path} can be used")
        inside = os.path.relpath(candidate, base)
        if for_write and (inside in self.protected or inside.split(os.sep)[0] in self.protected):
            raise WorkdirPathError(f"{relative}: protected ({', '.join(sorted(self.protected))} are read-only); "
                                   f"write your solution in {WORKDIR_MODEL_FILE} and {KERNELS_DIR}/")
        return Path(candidate)

    def snapshot(self, number: int) -> tuple[Path, list[str]]:
        """Copy the solution (``model_new.py`` and ``kernels/**`` sources) to ``snapshots/<number>``.

        Returns:
            The snapshot directory and notes on files left out (symlinks, special or huge files).
        """
        target = self.root / "snapshots" / str(number)
        target.mkdir(mode=0o755)
        skipped: list[str] = []
        _copy_regular(self.path / WORKDIR_MODEL_FILE, target / WORKDIR_MODEL_FILE, skipped)
        if self.style == "paper":  # the harness's own copies: they mark the registry binding style
            for name in REGISTRY_FILES:
                _copy_regular(self.path / name, target / name, skipped)
        kernels = self.path / KERNELS_DIR
        for directory, subdirs, files in os.walk(kernels):  # os.walk does not follow symlinked dirs
            subdirs[:] = sorted(d for d in subdirs if not os.path.islink(os.path.join(directory, d)))
            for name in sorted(files):
                if Path(name).suffix in KERNEL_SUFFIXES:
                    source = Path(directory) / name
                    _copy_regular(source, target / source.relative_to(self.path), skipped)
        return target, skipped

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def skill_text() -> str:
    """The SKILL.md shipped with the package (the workflow, rules and commands)."""
    return resources.files("cuda_agent.agent").joinpath(SKILL_FILE).read_text()


def _lay_out_paper_files(path: Path) -> None:
    """The released layout's fixed files: the harness's binding registry and the protected utils/."""
    _write_protected(path / "binding_registry.h", REGISTRY_HEADER, 0o444)
    _write_protected(path / "binding.cpp", REGISTRY_MODULE_SOURCE.format(name=EXTENSION_NAME), 0o444)
    utils = path / "utils"
    utils.mkdir(mode=0o755)
    _write_protected(utils / "__init__.py", "", 0o444)
    for relative, op in PAPER_COMMANDS.items():
        _write_protected(path / relative, _CLIENT.format(python=sys.executable, op=op, up="../.."), 0o555)
    _write_protected(utils / "compile.sh", f'#!/bin/bash\nexec {sys.executable} -IS "$(dirname "$0")/compile.py"\n', 0o555)


def _write_protected(path: Path, text: str, mode: int) -> None:
    path.write_text(text)
    path.chmod(mode)


def _copy_regular(source: Path, target: Path, skipped: list[str]) -> None:
    """Copy ``source`` if it is a regular file (opened without following a symlink)."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    except OSError as exc:
        skipped.append(f"{source.name}: not copied ({'a symlink' if os.path.islink(source) else exc.strerror})")
        return
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOLUTION_FILE_BYTES:
            skipped.append(f"{source.name}: not copied (not a regular file of at most {MAX_SOLUTION_FILE_BYTES} bytes)")
            return
        data = handle.read(MAX_SOLUTION_FILE_BYTES + 1)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)

"""Candidate solutions in the two accepted layouts.

1. Single file defining ``class ModelNew`` (KernelBench style), usually compiling its kernels with
   ``torch.utils.cpp_extension.load_inline`` when imported.
2. The CUDA Agent workdir: ``model_new.py`` importing ``cuda_extension``, which the protected build
   compiles from ``kernels/*.cu`` / ``kernels/*.cpp``, in one of two binding styles:

   - ``register`` (ours): every ``kernels/<name>_binding.cpp`` defines
     ``void register_<name>(pybind11::module_& m)``;
   - ``registry`` (the paper's released workdir, recognised by ``binding_registry.h`` or
     ``binding.cpp`` in the workdir): binding files include ``../binding_registry.h`` and register
     with ``REGISTER_BINDING(name, function)``. The build compiles the harness's own
     ``binding.cpp`` and ``binding_registry.h`` in place of the workdir's copies, which are
     infrastructure the candidate may not change;
   - ``launcher`` (the fast contract, recognised by kernel units that include
     ``<cuda_agent_launcher.h>`` and no ``*_binding.cpp``): kernels export ``extern "C"``
     launchers and include no torch header; the harness's pre-built shim is the tensor glue
     (see :mod:`launchers`).
"""

from __future__ import annotations

import ast
import enum
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.environment.launchers import uses_launchers
from cuda_agent.python_source import parse_source

WORKDIR_MODEL_FILE = "model_new.py"
KERNELS_DIR = "kernels"
EXTENSION_NAME = "cuda_extension"
KERNEL_SUFFIXES = (".cu", ".cpp", ".cc", ".cuh", ".h", ".hpp")
REGISTRY_FILES = ("binding.cpp", "binding_registry.h")
"""The released workdir's fixed binding infrastructure; either one marks the ``registry`` style."""
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SolutionError(ValueError):
    """The solution path does not hold a valid solution in either layout."""


class Layout(str, enum.Enum):
    SINGLE_FILE = "single_file"
    WORKDIR = "workdir"


@dataclass(frozen=True)
class Solution:
    """A candidate on disk. ``kernel_files`` is empty for the single-file layout."""

    layout: Layout
    root: Path  # the file itself, or the workdir
    model_file: Path  # the file that defines ModelNew
    kernel_files: tuple[Path, ...] = ()
    binding_style: str = "register"  # "register", "registry" or "launcher" (see the module docstring)

    @property
    def binding_names(self) -> tuple[str, ...]:
        """``relu`` for ``kernels/relu_binding.cpp``: each must define ``register_relu``."""
        return tuple(p.name[: -len("_binding.cpp")] for p in self.kernel_files if p.name.endswith("_binding.cpp"))

    def cuda_parts(self) -> tuple[str, ...]:
        """Where the solution holds CUDA, read without building or running anything: its
        ``kernels/*.cu``, or the model file's ``load_inline`` calls with ``cuda_sources`` and
        ``load`` calls of ``.cu`` files (``relu.py:77 cuda_sources``). Empty: C++ only."""
        if self.layout is Layout.WORKDIR:
            return tuple(str(p.relative_to(self.root)) for p in self.kernel_files if p.suffix == ".cu")
        return _cuda_load_calls(self.model_file)

    def compiles_nothing(self) -> bool:
        """A single file that never names ``cpp_extension`` or ``load_inline``: plain PyTorch (a
        ``tasks check`` candidate, say), for which no compiler runs. Read from the text alone; code
        that reaches the compiler some other way still builds, only without the prepared toolchain."""
        if self.layout is not Layout.SINGLE_FILE:
            return False
        source = self.model_file.read_text()
        return "cpp_extension" not in source and "load_inline" not in source

    def content_hash(self) -> str:
        """Hash of everything the build compiles (the model file too for the single-file layout)."""
        digest = hashlib.sha256(f"{self.layout.value}:{self.binding_style}".encode())
        files = (self.model_file,) if self.layout is Layout.SINGLE_FILE else self.kernel_files
        for path in files:
            digest.update(str(path.relative_to(self.root.parent if path == self.root else self.root)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
        return digest.hexdigest()


def _cuda_load_calls(path: Path) -> tuple[str, ...]:
    """``file:line`` of each ``load_inline(..., cuda_sources=<not empty>)`` (keyword or third
    positional argument) and each ``load(...)`` whose sources name a ``.cu`` file in ``path``."""
    found = []
    for node in ast.walk(parse_source(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        arguments = {k.arg: k.value for k in node.keywords if k.arg}
        if name == "load_inline":
            cuda = arguments.get("cuda_sources", node.args[2] if len(node.args) > 2 else None)
            if cuda is not None and not _empty_literal(cuda):
                found.append(f"{path.name}:{node.lineno} cuda_sources")
        elif name == "load":
            sources = arguments.get("sources", node.args[1] if len(node.args) > 1 else None)
            if sources is not None and any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                                           and c.value.endswith(".cu") for c in ast.walk(sources)):
                found.append(f"{path.name}:{node.lineno} .cu sources")
    return tuple(found)


def _empty_literal(node: ast.expr) -> bool:
    """``None``, ``""``, ``[]`` or ``()`` written out: no source at all."""
    if isinstance(node, ast.Constant):
        return node.value in (None, "")
    return isinstance(node, (ast.List, ast.Tuple)) and not node.elts


def _defines_model_new(path: Path) -> None:
    try:
        tree = parse_source(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise SolutionError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SolutionError(f"{path}: cannot read solution ({exc})") from None
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        raise SolutionError(f"{path}: no top-level 'class ModelNew'; a solution must define ModelNew(nn.Module)")


def load_solution(path: str | Path) -> Solution:
    """Detect the layout of ``path`` and validate it.

    Raises:
        SolutionError: naming the path and what is missing or malformed.
    """
    path = Path(path).resolve()
    if path.is_file():
        if path.suffix != ".py":
            raise SolutionError(f"{path}: a single-file solution must be a .py file defining ModelNew")
        _defines_model_new(path)
        return Solution(Layout.SINGLE_FILE, path, path)
    if not path.is_dir():
        raise SolutionError(f"{path}: no such file or directory")
    model_file = path / WORKDIR_MODEL_FILE
    if not model_file.is_file():
        raise SolutionError(f"{path}: a workdir solution needs {WORKDIR_MODEL_FILE} (and {KERNELS_DIR}/)")
    _defines_model_new(model_file)
    kernels_dir = path / KERNELS_DIR
    kernel_files = tuple(sorted(p for p in kernels_dir.rglob("*") if p.suffix in KERNEL_SUFFIXES and p.is_file())) \
        if kernels_dir.is_dir() else ()
    if any((path / name).is_file() for name in REGISTRY_FILES):
        if not any(p.suffix in (".cu", ".cpp", ".cc") for p in kernel_files):
            raise SolutionError(f"{path}: a workdir with {' / '.join(REGISTRY_FILES)} needs its kernels in "
                                f"{KERNELS_DIR}/ (*.cu, *_binding.cpp registering with REGISTER_BINDING)")
        return Solution(Layout.WORKDIR, path, model_file, kernel_files, binding_style="registry")
    solution = Solution(Layout.WORKDIR, path, model_file, kernel_files)
    if not solution.binding_names:
        if uses_launchers(kernel_files):
            return Solution(Layout.WORKDIR, path, model_file, kernel_files, binding_style="launcher")
        # No extension to build: model_new.py must then be self-contained (e.g. load_inline).
        return Solution(Layout.SINGLE_FILE, path, model_file)
    for name in solution.binding_names:
        if not _IDENTIFIER.match(name):
            raise SolutionError(
                f"{kernels_dir / (name + '_binding.cpp')}: binding name {name!r} is not a C identifier; "
                "rename the file to <identifier>_binding.cpp"
            )
    return solution

"""The sources a static guard reads, and the guard interface.

Guards run in the trusted parent before anything is built or imported: they read source text only.
A ``SourceBundle`` holds a solution's Python file and C++/CUDA files; parsing (Python AST, C++
tokens) happens once per bundle and is shared by all guards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from cuda_agent.environment.guards.config import GuardConfig
from cuda_agent.environment.guards.cpp_lexer import CppSource
from cuda_agent.environment.guards.cpp_model import CppUnit
from cuda_agent.environment.guards.python_model import PyModule, parse_python
from cuda_agent.environment.solution import EXTENSION_NAME, KERNEL_SUFFIXES, KERNELS_DIR, Layout, Solution
from cuda_agent.environment.verdict import Violation

MAX_SOURCE_BYTES = 1 << 20
"""Largest file the guards read (1 MiB); a bigger one is ``source-too-large``."""
MAX_KERNEL_FILES = 256
"""Most kernel files the guards read; more is ``source-too-large``."""


@dataclass(frozen=True)
class SourceBundle:
    """A solution's sources as text.

    ``python`` maps the display path of each Python file to its text (the file that defines
    ``ModelNew``); ``cpp`` maps the display path of each C++/CUDA file to its text (``kernels/*``).
    C++/CUDA carried inside the Python file (``load_inline`` sources, ``-D`` flags, long C++-looking
    string literals) is found from the AST: ``cpp_sources`` lists both kinds.
    """

    python: Mapping[str, str]
    """Display path (``model_new.py``) -> text of each Python file the guards parse."""
    cpp: Mapping[str, str] = field(default_factory=dict)
    """Display path (``kernels/relu.cu``) -> text of each C++/CUDA file."""
    root: Path | None = None
    """The solution (file or directory) on disk; ``load(sources=[...])`` paths resolve inside it."""
    problems: tuple[Violation, ...] = ()
    """Files that could not be read or are too large (reported as they are)."""
    _cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_solution(cls, solution: Solution) -> SourceBundle:
        """Read the model file and the kernel files of ``solution`` (never imports anything)."""
        base = solution.root if solution.root.is_dir() else solution.root.parent
        problems: list[Violation] = []
        python: dict[str, str] = {}
        text = _read(solution.model_file, base, problems)
        if text is not None:
            python[_display(solution.model_file, base)] = text
        kernel_files = list(solution.kernel_files)
        if solution.layout is Layout.SINGLE_FILE and solution.root.is_dir() and (solution.root / KERNELS_DIR).is_dir():
            kernel_files = sorted(p for p in (solution.root / KERNELS_DIR).rglob("*")
                                  if p.suffix in KERNEL_SUFFIXES and p.is_file())
        if len(kernel_files) > MAX_KERNEL_FILES:
            problems.append(Violation("source-too-large", f"{KERNELS_DIR}/: {len(kernel_files)} files, more than "
                                                          f"{MAX_KERNEL_FILES}; keep the kernels in fewer files"))
            kernel_files = kernel_files[:MAX_KERNEL_FILES]
        if solution.root.is_dir():
            for shadow in sorted(solution.root.glob(f"{EXTENSION_NAME}*")):
                problems.append(Violation("unverifiable-source", f"{_display(shadow, base)}: a file named like the "
                                          f"extension can shadow the built {EXTENSION_NAME}; remove it"))
        cpp: dict[str, str] = {}
        for path in kernel_files:
            text = _read(path, base, problems)
            if text is not None:
                cpp[_display(path, base)] = text
        return cls(python, cpp, solution.root, tuple(problems))

    # -- parsed views, computed once ---------------------------------------------------------------
    @cached_property
    def python_modules(self) -> dict[str, PyModule | str]:
        """Each Python file parsed, or the one-line reason it does not parse."""
        out: dict[str, PyModule | str] = {}
        for path, text in self.python.items():
            directory = None
            if self.root is not None:
                directory = (self.root if self.root.is_dir() else self.root.parent) / Path(path).parent
            out[path] = parse_python(path, text, directory, self.root)
        return out

    @property
    def parsed_python(self) -> list[PyModule]:
        return [m for m in self.python_modules.values() if isinstance(m, PyModule)]

    @cached_property
    def cpp_sources(self) -> list[CppSource]:
        """Kernel files plus the C++/CUDA embedded in (or loaded by) the Python files."""
        sources = [CppSource(path, text) for path, text in self.cpp.items()]
        for module in self.parsed_python:
            sources.extend(module.embedded_cpp())
        return sources

    @cached_property
    def cpp_units(self) -> list[CppUnit]:
        return [CppUnit(source) for source in self.cpp_sources]

    def cached(self, key: Any, compute: Any) -> Any:
        """``compute()`` once per key for this bundle (analyses shared between guards)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]


class StaticGuard(ABC):
    """One rule over a solution's source text. ``name`` is the guard's registry key; the codes of
    the violations it reports are documented in docs/guards.md."""

    name: str

    @abstractmethod
    def check(self, bundle: SourceBundle, config: GuardConfig) -> list[Violation]:
        """Violations found in ``bundle`` (empty when it is clean). May raise on inputs it cannot
        analyse: the runner turns that into a ``guard-error`` violation."""


def _display(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return path.name


def _read(path: Path, base: Path, problems: list[Violation]) -> str | None:
    display = _display(path, base)
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            problems.append(Violation("source-too-large", f"{display}: {size} bytes, more than {MAX_SOURCE_BYTES}; "
                                                          "the guards read sources up to 1 MiB"))
            return None
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        problems.append(Violation("unreadable-source", f"{display}: cannot be read ({exc.strerror or exc}); "
                                                       "make it a readable text file"))
        return None

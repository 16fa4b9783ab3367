"""Single-file candidates' ``load_inline``/``load`` calls: compiled by the build, loaded by the worker.

In the compile child, torch's JIT builders are replaced by :class:`LeanBuilders`, which compile the
same module through the lean path (:mod:`compiler`) and record each call in a manifest: the
extension's name, a hash of the call's arguments (sources, functions, flags; file contents for
``load``) and the built library. In the candidate worker, :func:`prebuilt_loader` answers the same
call by importing that library: the candidate process never runs a compiler, and a call whose
arguments differ from the built one (sources generated differently at run time) is an error.
Calls the lean path does not support (``is_python_module=False``, SYCL, ...) go to torch's builder
in both processes, as before, and so does a call the lean path fails to build for any reason other
than a compiler diagnostic in the candidate's own source (which torch's builder, compiling the same
text with the same flags, would report too) or a killed compiler (an infrastructure fault the build
retries): whatever torch's builder accepts, the build accepts.

The CUDA unit of a ``load_inline`` call gets torch's prelude (``torch/types.h``, tens of seconds of
nvcc front end) only when it needs it: a CUDA source that neither includes nor names anything of
torch, ATen or c10 (the kernels and their launchers, the tensor glue in ``cpp_sources``) is compiled
after CUDA's headers alone, and if that fails for any reason but a killed compiler, once more with
torch's prelude, exactly as torch's builder would: the outcome is the full prelude's whenever the
light one is not enough.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import logging
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from cuda_agent.environment.compiler import BuildFailed, ExtensionCompiler, Unit, compiler_was_killed

logger = logging.getLogger(__name__)

MANIFEST = "prebuilt.json"
_SUPPORTED = {
    "load_inline": {"name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
                    "extra_ldflags", "extra_include_paths", "build_directory", "verbose", "with_cuda",
                    "is_python_module", "with_pytorch_error_handling", "keep_intermediates", "use_pch"},
    "load": {"name", "sources", "extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths",
             "build_directory", "verbose", "with_cuda", "is_python_module", "keep_intermediates"},
}
_NOT_PART_OF_THE_BUILD = {"build_directory", "verbose", "keep_intermediates", "use_pch"}
_INLINE_CPP_HEADER = "#include <torch/extension.h>\n"
_INLINE_CUDA_HEADER = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
_LIGHT_CUDA_HEADER = "#include <cuda.h>\n#include <cuda_runtime.h>\n"
_TORCH_NAMES = re.compile(r"#\s*include\s*[<\"](?:torch|ATen|c10|pybind11)/|\b(?:torch|at|c10|pybind11)\s*::"
                          r"|\b(?:TORCH|AT|C10)_[A-Z_]+\b")
"""What makes a CUDA source need torch's prelude: an include of torch's headers, a name in one of
its namespaces, or one of its macros."""


class PrebuiltMismatch(ImportError):
    """The candidate asked, at run time, for an extension the build did not compile."""


def bound_call(kind: str, builder: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """The call's arguments by name, defaults applied; None when the lean path cannot build it."""
    try:
        bound = inspect.signature(builder).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.update(arguments.pop("kwargs", {}) or {})
    given = {k for k, v in arguments.items() if v not in (None, False, [], (), "", {})}
    if given - _SUPPORTED[kind] or not arguments.get("is_python_module", True):
        return None
    return arguments


def call_key(kind: str, arguments: dict[str, Any]) -> str:
    """Hash of everything in a call that decides the module: for ``load``, the files' names and
    contents, not where they are (the build and the candidate worker see copies of the solution
    in different folders)."""
    relevant = {k: v for k, v in arguments.items() if k not in _NOT_PART_OF_THE_BUILD}
    if kind == "load":
        for name in ("sources", "extra_include_paths"):
            relevant[name] = [Path(p).name for p in _as_list(arguments.get(name))]
    digest = hashlib.sha256(kind.encode() + json.dumps(relevant, sort_keys=True, default=str).encode())
    if kind == "load":
        for source in _as_list(arguments["sources"]):
            digest.update(b"\0" + Path(source).read_bytes())
    return digest.hexdigest()


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


class LeanBuilders:
    """Replacements for torch's JIT builders in the compile child."""

    def __init__(self, make_compiler: Callable[[bool], ExtensionCompiler], extensions_dir: Path) -> None:
        """``make_compiler(with_cuda)``: the compiler for an extension with or without CUDA."""
        self.make_compiler, self.extensions_dir = make_compiler, extensions_dir
        self.manifest: dict[str, dict[str, str]] = {}

    def wrap(self, kind: str, builder: Callable[..., Any]) -> Callable[..., Any]:
        """``builder`` (torch's ``load_inline`` or ``load``) through the lean path where it can."""

        def lean(*args: Any, **kwargs: Any) -> Any:
            arguments = bound_call(kind, builder, args, kwargs)
            module, reason = None, "a call the lean path does not support"
            if arguments is not None:
                try:
                    module = self._build(kind, arguments)
                except BuildFailed as exc:
                    if compiler_was_killed(str(exc)) or _diagnosed_in_candidate_source(
                            str(exc), self.extensions_dir / arguments["name"], arguments):
                        raise  # killed: an infrastructure fault, retried by the build; diagnosed: the candidate's
                    reason = f"the lean path failed ({str(exc).splitlines()[0]})"
                    logger.info("%s: %s; building with torch's builder", arguments["name"], reason)
            if module is None:
                module = builder(*args, **kwargs)
                self.manifest[str(kwargs.get("name", args[0] if args else ""))] = {"builder": "torch", "reason": reason}
            self._write_manifest()
            return module

        return lean

    def _build(self, kind: str, arguments: dict[str, Any]) -> ModuleType:
        name = arguments["name"]
        out_dir = self.extensions_dir / name
        out_dir.mkdir(parents=True, exist_ok=True)
        light = kind == "load_inline" and light_prelude_suffices(_as_list(arguments.get("cuda_sources")))
        units = _inline_units(arguments, out_dir, light) if kind == "load_inline" else _file_units(arguments)
        has_cuda = any(u.is_cuda for u in units) or bool(arguments.get("with_cuda"))
        compiler = self.make_compiler(has_cuda)
        includes = tuple(Path(p).resolve() for p in _as_list(arguments.get("extra_include_paths")))
        ldflags = _flags(arguments.get("extra_ldflags"))
        try:
            library = compiler.build(name, units, out_dir, includes, ldflags)
        except BuildFailed as exc:
            if not light or compiler_was_killed(str(exc)) or str(exc).startswith("compile main.cpp failed"):
                raise  # no prelude of the CUDA unit can mend a killed compiler or the C++ unit's error
            logger.info("%s: the CUDA source needs more than CUDA's headers; compiling it after torch's prelude", name)
            light = False
            library = compiler.build(name, _inline_units(arguments, out_dir, light), out_dir, includes, ldflags)
        self.manifest[name] = {"builder": "lean", "call": call_key(kind, arguments),
                               "library": str(library.relative_to(self.extensions_dir))}
        if kind == "load_inline" and arguments.get("cuda_sources"):
            self.manifest[name]["cuda_prelude"] = "light" if light else "torch"
        return import_library(name, library)

    def _write_manifest(self) -> None:
        (self.extensions_dir / MANIFEST).write_text(json.dumps(self.manifest, indent=1))


def light_prelude_suffices(cuda_sources: list[str]) -> bool:
    """Whether a ``load_inline`` call's CUDA sources may first be compiled after CUDA's headers
    alone (they include and name nothing of torch's; see the module docstring)."""
    return bool(cuda_sources) and not any(_TORCH_NAMES.search(source) for source in cuda_sources)


def _inline_units(arguments: dict[str, Any], out_dir: Path, light_prelude: bool) -> list[Unit]:
    """The two files torch's ``load_inline`` writes: C++ (with the pybind11 functions) and CUDA
    (after CUDA's headers alone when ``light_prelude``, else after torch's prelude)."""
    cpp = "\n".join(_as_list(arguments["cpp_sources"]))
    functions = arguments.get("functions")
    if functions:
        named = functions if isinstance(functions, dict) else {f: f for f in _as_list(functions)}
        wrap = arguments.get("with_pytorch_error_handling", True)
        defs = "\n".join(f'm.def("{f}", {"torch::wrap_pybind_function(" + f + ")" if wrap else f}, "{doc}");'
                         for f, doc in named.items())
        cpp += f"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}\n}}\n"
    cpp_flags = _flags(arguments.get("extra_cflags"))
    units = [_write(out_dir / "main.cpp", _INLINE_CPP_HEADER + cpp, cpp_flags)]
    cuda = _as_list(arguments.get("cuda_sources"))
    if cuda:
        prelude = _LIGHT_CUDA_HEADER if light_prelude else _INLINE_CUDA_HEADER
        units.append(_write(out_dir / "cuda.cu", prelude + "\n".join(cuda),
                            _flags(arguments.get("extra_cuda_cflags"))))
    return units


def _diagnosed_in_candidate_source(message: str, out_dir: Path, arguments: dict[str, Any]) -> bool:
    """Whether a failed lean build's compiler output holds an error located in one of the
    candidate's own source files (``file:line[:col]: error`` from gcc, ``file(line): error`` from
    nvcc): then the candidate's code is wrong, not the build path."""
    sources = [out_dir / "main.cpp", out_dir / "cuda.cu", *(Path(s).resolve() for s in _as_list(arguments.get("sources")))]
    names = "|".join(re.escape(str(s)) for s in sources)
    return re.search(rf"(?:{names})(?::\d+(?::\d+)?:|\(\d+\):) (?:fatal )?error", message) is not None


def _file_units(arguments: dict[str, Any]) -> list[Unit]:
    cpp_flags, cuda_flags = _flags(arguments.get("extra_cflags")), _flags(arguments.get("extra_cuda_cflags"))
    return [Unit(Path(s).resolve(), cuda_flags if str(s).endswith(".cu") else cpp_flags)
            for s in _as_list(arguments["sources"])]


def _flags(value: Any) -> tuple[str, ...]:
    """A flag list as torch uses it (stripped, empty entries dropped: ``[""]`` is no flag)."""
    return tuple(f.strip() for f in _as_list(value) if f.strip())


def _write(path: Path, text: str, flags: tuple[str, ...]) -> Unit:
    path.write_text(text)
    return Unit(path, flags)


def import_library(name: str, library: Path) -> ModuleType:
    """Import a built extension module from its shared library (as torch's loader does)."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the extension library {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prebuilt_loader(kind: str, builder: Callable[..., Any], extensions_dir: Callable[[], Path | None]) -> Callable[..., Any]:
    """The candidate worker's ``load_inline``/``load``: import what the build compiled for this
    call; calls the build gave to torch's builder still go there (``extensions_dir()`` is read at
    call time: it is set when the candidate is loaded)."""

    def load(*args: Any, **kwargs: Any) -> Any:
        directory = extensions_dir()
        manifest_path = directory / MANIFEST if directory is not None else None
        arguments = bound_call(kind, builder, args, kwargs)
        if manifest_path is None or not manifest_path.is_file() or arguments is None:
            return builder(*args, **kwargs)
        entry = json.loads(manifest_path.read_text()).get(arguments["name"])
        if entry is None or entry.get("builder") != "lean":
            return builder(*args, **kwargs)
        if entry.get("call") != call_key(kind, arguments):
            raise PrebuiltMismatch(
                f"{kind}(name={arguments['name']!r}) is called with other sources or flags than the protected build "
                "compiled: a solution must build the same extension every time it is imported")
        return import_library(arguments["name"], directory / entry["library"])

    return load


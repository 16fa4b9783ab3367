"""The Python halves of the static guards: one check function per violation code, over the AST.

Each function takes the parsed module (and, where it needs to know what ``forward`` reaches, the
``ForwardAnalysis``) and returns violations whose messages start with ``file:line``.
"""

from __future__ import annotations

import ast
import sys
from typing import Callable, Iterator

from cuda_agent.environment.guards.config import KNOWN_LIBRARIES, GuardConfig
from cuda_agent.environment.guards.forward_analysis import ForwardAnalysis
from cuda_agent.environment.guards.python_model import PyModule, snippet
from cuda_agent.environment.solution import EXTENSION_NAME
from cuda_agent.environment.verdict import Violation

REFERENCE_MODULES = frozenset({"model", "reference"})
CONCURRENCY_MODULES = ("threading", "_thread", "multiprocessing", "concurrent", "subprocess", "asyncio", "signal",
                       "sched", "pty", "_posixsubprocess", "multiprocess", "joblib", "ray", "dask",
                       "torch.multiprocessing", "torch.distributed", "torch.futures")
_OS_PROCESS = ("os.system", "os.popen", "os.fork", "os.forkpty", "os.spawn", "os.exec", "os.posix_spawn", "os.kill",
               "os.killpg", "os.startfile", "os.register_at_fork", "os.pidfd_open", "posix.system", "posix.fork")
DYNAMIC_MODULES = ("importlib", "imp", "runpy", "pickle", "_pickle", "marshal", "dill", "cloudpickle", "code",
                   "codeop", "pkgutil", "zipimport", "shelve")
_DYNAMIC_QUALS = ("types.FunctionType", "types.CodeType", "types.LambdaType", "types.ModuleType",
                  "torch.ops.load_library", "torch.classes.load_library", "torch.load", "torch.jit.load",
                  "numpy.load", "torch.package")
_DYNAMIC_BUILTINS = ("exec", "eval", "compile", "__import__", "breakpoint")
_NAMESPACE_WRITERS = ("update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__")
PATCH_ATTRIBUTES = frozenset({"__code__", "__globals__", "__builtins__", "__class__", "__dict__", "__defaults__",
                              "__kwdefaults__", "__closure__", "__bases__", "__call__", "__getattr__",
                              "__getattribute__", "__setattr__", "__init_subclass__", "forward", "_call_impl",
                              "_wrapped_call_impl"})
_GLOBAL_STATE_CALLS = ("torch.set_", "torch.backends.", "torch._C._set", "torch.use_deterministic_algorithms",
                       "torch.cuda.set_sync_debug_mode", "torch.cuda.set_per_process_memory_fraction",
                       "torch.cuda.memory.", "torch._C._jit_set")
_ENV_ALLOWED = frozenset({"TORCH_CUDA_ARCH_LIST", "MAX_JOBS"})
_INTROSPECTION = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "gc.garbage", "inspect.currentframe",
                  "inspect.stack", "inspect.trace", "inspect.getouterframes", "inspect.getinnerframes",
                  "inspect.getframeinfo", "sys._getframe", "sys._current_frames", "sys.modules", "sys.settrace",
                  "sys.setprofile", "sys.addaudithook", "sys.meta_path", "sys.path_hooks", "sys.monitoring",
                  "traceback.walk_stack", "traceback.extract_stack", "torch.cuda.cudart", "ctypes", "_ctypes", "cffi",
                  "__main__", "_testcapi", "builtins.__dict__")
FRAME_ATTRIBUTES = frozenset({"f_back", "f_locals", "f_globals", "f_code", "f_builtins", "tb_frame", "tb_next",
                              "gi_frame", "cr_frame", "ag_frame", "__traceback__", "__subclasses__", "__globals__"})
TENSOR_BASES = frozenset({"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter",
                          "torch.nn.parameter.Parameter", "torch.nn.Buffer", "torch.nn.parameter.Buffer",
                          "torch.nn.parameter.UninitializedParameter", "torch.nn.parameter.UninitializedBuffer",
                          "torch.tensor.Tensor", "torch._tensor.Tensor"})
_DISPATCH_MODULES = ("torch.utils._python_dispatch", "torch._subclasses", "torch.overrides", "torch.utils._mode_utils",
                     "torch._C._TorchDispatchModeKey", "torch._C._push_on_torch_function_stack",
                     "torch._C._push_on_torch_dispatch_stack", "torch._C.DisableTorchFunction")
_SUBCLASS_ATTRIBUTES = frozenset({"_make_subclass", "_make_wrapper_subclass", "as_subclass",
                                  "_disabled_torch_function_impl", "_disabled_torch_dispatch_impl",
                                  "__torch_function__", "__torch_dispatch__"})
NETWORK_MODULES = ("socket", "urllib", "http", "requests", "httpx", "ftplib", "smtplib", "telnetlib", "ssl",
                   "aiohttp", "websocket", "websockets", "paramiko", "xmlrpc", "urllib3", "grpc", "zmq", "pycurl",
                   "poplib", "imaplib", "nntplib", "socketserver", "webbrowser", "torch.hub", "torch.utils.model_zoo")
_OS_FILE_CALLS = ("remove", "unlink", "rename", "renames", "replace", "chmod", "fchmod", "lchmod", "chown", "fchown",
                  "lchown", "makedirs", "mkdir", "rmdir", "removedirs", "symlink", "link", "truncate", "ftruncate",
                  "utime", "open", "fdopen", "write", "pwrite", "writev", "pwritev", "dup", "dup2", "sendfile",
                  "splice", "copy_file_range", "memfd_create", "mkfifo", "mknod")
"""File-system and file-descriptor calls of ``os`` (and of ``posix``, which ``os`` re-exports)."""
_FILE_WRITES = tuple(f"{module}.{name}" for module in ("os", "posix") for name in _OS_FILE_CALLS) + (
    "shutil", "tempfile", "sqlite3", "_sqlite3", "dbm", "_dbm", "_gdbm", "logging.FileHandler", "logging.handlers",
    "logging.config", "torch.save", "numpy.save", "numpy.savez", "numpy.savetxt", "numpy.savez_compressed",
    "numpy.memmap", "pathlib.Path.write_text", "pathlib.Path.write_bytes")
_OPENERS = ("io.open", "io.FileIO", "_io.open", "_io.FileIO", "codecs.open", "gzip.open", "gzip.GzipFile", "bz2.open",
            "bz2.BZ2File", "lzma.open", "lzma.LZMAFile", "zipfile.ZipFile", "zipfile.PyZipFile", "tarfile.open",
            "tarfile.TarFile")
"""Openers judged by their mode (``w``, ``a``, ``x``, ``+`` write); reading is allowed."""
_PATH_WRITES = frozenset({"write_text", "write_bytes", "unlink", "touch", "mkdir", "rmdir", "rename", "symlink_to",
                          "hardlink_to", "link_to", "chmod", "lchmod", "tofile"})
STREAM_APIS = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream",
               "torch.cuda.StreamContext", "torch.cuda.streams.Stream", "torch.cuda.streams.ExternalStream",
               "torch.Stream", "torch.cuda.graph", "torch.cuda.CUDAGraph", "torch.cuda.graphs",
               "torch.cuda.make_graphed_callables", "torch.accelerator.set_stream", "torch.cuda.set_device_stream")
_TORCH_COMPILERS = ("torch.compile", "torch.jit", "torch._dynamo", "torch._inductor", "torch.export", "torch.fx",
                    "torch.library", "torch._higher_order_ops", "torch._prims", "torch._refs", "torch._decomp")
_BENIGN_TORCH_COMPILER_NAMES = frozenset({"torch.jit.is_scripting", "torch.jit.is_tracing", "torch.jit.ignore",
                                          "torch.jit.unused", "torch.compiler.is_compiling"})
_IMPORTABLE = frozenset(sys.stdlib_module_names) | {"torch", EXTENSION_NAME, "numpy", "typing_extensions", "__future__"}


def _v(code: str, module: PyModule, node: ast.AST, message: str) -> Violation:
    return Violation(code, f"{module.where(node)}: {message}")


def _matches(qual: str, prefixes: tuple[str, ...] | frozenset[str]) -> bool:
    """``qual`` is one of ``prefixes`` or below one (whole dotted segments; ``os.spawn``/``os.exec``
    also match ``os.spawnv``/``os.execve``)."""
    for p in prefixes:
        if qual == p or qual.startswith(p + ".") or (p in ("os.spawn", "os.exec", "os.posix_spawn")
                                                     and qual.startswith(p)):
            return True
    return False


def _imports_and_references(module: PyModule, code: str, prefixes: tuple[str, ...],
                            what: Callable[[str], str], exclude: frozenset[str] = frozenset()) -> list[Violation]:
    """Flag imports of names under ``prefixes`` and references to them (a reference through a name
    that a flagged import bound is not reported twice)."""
    out = []
    flagged_names = set()
    for rec in module.imports:
        if rec.target in exclude:
            continue
        if _matches(rec.target, prefixes) or _matches(rec.module, prefixes):
            out.append(_v(code, module, rec.node, what(rec.target if _matches(rec.target, prefixes) else rec.module)))
            flagged_names.add(rec.bound)
    for node, qual in module.references:
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if _matches(qual, prefixes) and qual not in exclude and getattr(root, "id", None) not in flagged_names:
            out.append(_v(code, module, node, what(qual)))
    return out


def _shallow_walk(nodes: list[ast.AST]) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested functions or classes."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)


# -- inherits-reference ------------------------------------------------------------------------------
def check_inherits_reference(module: PyModule) -> list[Violation]:
    out = []
    for rec in module.imports:
        parts = [p for p in rec.target.split(".") if p]
        if any(p in REFERENCE_MODULES for p in parts) or (parts and parts[-1] == "Model"):
            out.append(_v("inherits-reference", module, rec.node,
                          f"imports the reference ({rec.target}); ModelNew must not use the reference Model"))
    model_new = module.classes.get("ModelNew")
    seen: set[str] = set()
    stack = [model_new] if model_new is not None else []
    while stack:
        cls = stack.pop()
        for base in cls.bases:
            qual = module.qualname(base) or ""
            name = base.id if isinstance(base, ast.Name) else ""
            if name == "Model" or qual.rsplit(".", 1)[-1] == "Model" or any(
                    p in REFERENCE_MODULES for p in qual.split(".")):
                out.append(_v("inherits-reference", module, base,
                              f"class {cls.name} inherits from the reference {snippet(base)}; ModelNew must "
                              "subclass torch.nn.Module and compute with your extension"))
            elif name in module.classes and name not in seen and name not in module.aliases:
                seen.add(name)
                stack.append(module.classes[name])
    return out


# -- exception-fallback ------------------------------------------------------------------------------
def check_exception_fallback(module: PyModule, analysis: ForwardAnalysis) -> list[Violation]:
    out = []
    for node, label in analysis.reachable.values():
        body = node.body if isinstance(node.body, list) else [node.body]
        for child in _shallow_walk(body):
            if isinstance(child, (ast.Try, getattr(ast, "TryStar", ast.Try))) and child.handlers:
                out.append(_v("exception-fallback", module, child,
                              f"{label} catches exceptions, so a failing kernel can fall back to other code; "
                              "remove the try/except and let errors surface"))
    for node, qual in module.references:
        if qual == "contextlib.suppress":
            out.append(_v("exception-fallback", module, node,
                          "contextlib.suppress hides a failing kernel; remove it and let errors surface"))
    return out


# -- concurrency -------------------------------------------------------------------------------------
def check_concurrency(module: PyModule) -> list[Violation]:
    return _imports_and_references(
        module, "concurrency", CONCURRENCY_MODULES + _OS_PROCESS,
        lambda q: f"uses {q} (threads, processes or signals); do all work in forward, in your extension's kernels")


# -- dynamic-code ------------------------------------------------------------------------------------
def check_dynamic_code(module: PyModule) -> list[Violation]:
    out = _imports_and_references(
        module, "dynamic-code", DYNAMIC_MODULES + _DYNAMIC_QUALS,
        lambda q: f"uses {q}, which runs code the guards cannot read; keep all code as plain source in the solution")
    for node in module.nodes:
        if isinstance(node, ast.Name) and node.id in _DYNAMIC_BUILTINS and module.is_builtin(node, node.id):
            out.append(_v("dynamic-code", module, node,
                          f"uses {node.id}(), which runs code the guards cannot read; write the code out"))
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            out.append(_v("dynamic-code", module, node, "uses __builtins__; call builtins by name"))
        elif isinstance(node, ast.Call) and any(module.is_builtin(node.func, n) for n in ("getattr", "setattr",
                                                                                        "delattr", "hasattr")):
            name_arg = node.args[1] if len(node.args) > 1 else None
            literal = isinstance(name_arg, ast.Constant) and isinstance(name_arg.value, str)
            if node.args and not literal and module.qualname(node.args[0]) is not None:
                out.append(_v("dynamic-code", module, node,
                              f"{snippet(node.func)}() on module {snippet(node.args[0])} with a computed name hides "
                              "what is called; use the attribute by name"))
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and _is_namespace_call(module, node.value):
            writes = isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del))
            writes = writes or (isinstance(node, ast.Attribute) and node.attr in _NAMESPACE_WRITERS)
            if writes:
                out.append(_v("dynamic-code", module, node,
                              f"writes to {snippet(node.value)}, defining names the guards cannot see; "
                              "define them in the source"))
    return out


def _is_namespace_call(module: PyModule, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and any(module.is_builtin(node.func, n) for n in ("globals", "locals", "vars"))


# -- monkeypatch -------------------------------------------------------------------------------------
def check_monkeypatch(module: PyModule, analysis: ForwardAnalysis) -> list[Violation]:
    out = [_v("monkeypatch", module, target, f"assigns {snippet(target)}, replacing a function of your extension "
                                              "after it was built; call the extension's functions as built")
           for target in dict.fromkeys(analysis.patched_extension)]
    local_classes = set(module.classes)
    for node in module.nodes:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in _flatten_targets(targets):
            message = _patch_target(module, target, local_classes)
            if message:
                out.append(_v("monkeypatch", module, target, message))
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew" and node.decorator_list:
            out.append(_v("monkeypatch", module, node.decorator_list[0],
                          "ModelNew has a class decorator, which can replace the class; remove it"))
        if isinstance(node, ast.Call):
            message = _patch_call(module, node, local_classes)
            if message:
                out.append(_v("monkeypatch", module, node, message))
    for stmt in module.nodes:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == "ModelNew" \
                and stmt is not module.classes.get("ModelNew"):
            out.append(_v("monkeypatch", module, stmt, "defines ModelNew twice; keep one class ModelNew"))
    return out


def _flatten_targets(targets: list[ast.expr]) -> Iterator[ast.expr]:
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            yield from _flatten_targets(list(t.elts))
        elif isinstance(t, ast.Starred):
            yield from _flatten_targets([t.value])
        else:
            yield t


def _patch_target(module: PyModule, target: ast.expr, local_classes: set[str]) -> str | None:
    if isinstance(target, ast.Name) and target.id == "ModelNew":
        return "rebinds the name ModelNew after its class definition; keep the class as defined"
    if isinstance(target, ast.Subscript):
        owner = module.qualname(target.value)
        if owner == "os.environ":
            key = target.slice
            if isinstance(key, ast.Constant) and key.value in _ENV_ALLOWED:
                return None
            return f"sets environment variable {snippet(key)}; only {sorted(_ENV_ALLOWED)} may be set"
        if owner is not None:
            return f"modifies {owner}[...], state of another module; leave it unchanged"
        if isinstance(target.value, ast.Attribute) and target.value.attr in PATCH_ATTRIBUTES:
            return f"writes {snippet(target)}, replacing behaviour the harness relies on; define it in the class body"
        return None
    if not isinstance(target, ast.Attribute):
        return None
    if target.attr in PATCH_ATTRIBUTES:
        return f"assigns {snippet(target)}, replacing behaviour the harness relies on; define methods in the class body"
    qual = module.qualname(target)
    if qual is not None:
        return f"assigns {qual}, changing a module the harness and the reference also use; leave it unchanged"
    root = target.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and root.id in local_classes and root.id not in module.aliases \
            and isinstance(target.value, ast.Name):
        return f"assigns {snippet(target)} outside the class body; define it in class {root.id}"
    return None


def _setattr_target(module: PyModule, node: ast.Call) -> tuple[ast.expr, ast.expr | None] | None:
    """(object, name) of a ``setattr``-like call: ``setattr(o, n, v)``, ``object.__setattr__(o, n, v)``,
    ``o.__setattr__(n, v)`` (and the ``del`` forms); None for other calls."""
    func = node.func
    unbound = any(module.is_builtin(func, n) for n in ("setattr", "delattr")) or module.qualname(func) in (
        "builtins.setattr", "builtins.delattr") or (
        isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__")
        and isinstance(func.value, ast.Name) and (func.value.id in ("object", "type") or func.value.id in module.classes
                                                  or module.qualname(func.value) is not None))
    if unbound:
        return (node.args[0], node.args[1] if len(node.args) > 1 else None) if node.args else None
    if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"):
        return func.value, node.args[0] if node.args else None
    return None


def _patch_call(module: PyModule, node: ast.Call, local_classes: set[str]) -> str | None:
    func = node.func
    qual = module.qualname(func)
    target = _setattr_target(module, node)
    if target is not None:
        obj, name = target
        literal = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
        if module.qualname(obj) is not None or (isinstance(obj, ast.Name) and obj.id in local_classes):
            return f"{snippet(func)}() on {snippet(obj)} patches another module or class; leave it unchanged"
        if literal is None or literal in PATCH_ATTRIBUTES:
            return (f"{snippet(func)}() with {'a computed name' if literal is None else repr(literal)} can replace "
                    "forward or other methods; assign plain attributes by name")
    if isinstance(func, ast.Attribute) and func.attr.startswith(("register_", "_register_")) and "hook" in func.attr:
        return f"{func.attr}() makes calling the module run extra code; call your extension in forward instead"
    if qual is not None:
        last = qual.rsplit(".", 1)[-1]
        if _matches(qual, ("os.putenv", "os.unsetenv")) or (qual.startswith("os.environ.") and last in
                                                              _NAMESPACE_WRITERS):
            return f"{qual}() changes the environment; only os.environ[...] for {sorted(_ENV_ALLOWED)} is allowed"
        if qual.startswith(_GLOBAL_STATE_CALLS) and not last.startswith(("is_", "get_")) and last not in (
                "version", "set_printoptions"):
            return f"{qual}() changes global PyTorch state shared with the harness; remove it"
    return None


# -- introspection -----------------------------------------------------------------------------------
def check_introspection(module: PyModule) -> list[Violation]:
    out = _imports_and_references(
        module, "introspection", _INTROSPECTION,
        lambda q: f"uses {q}, which reaches into the harness's objects, frames or memory; remove it")
    inner = {id(n.value) for n in module.nodes if isinstance(n, ast.Attribute) and n.attr in FRAME_ATTRIBUTES}
    for node in module.nodes:
        if isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRIBUTES and isinstance(node.ctx, ast.Load) \
                and id(node) not in inner:
            out.append(_v("introspection", module, node,
                          f"reads {snippet(node)}, reaching into other code's frames or globals; remove it"))
    return out


# -- tensor-subclass ---------------------------------------------------------------------------------
def check_tensor_subclass(module: PyModule) -> list[Violation]:
    out = _imports_and_references(
        module, "tensor-subclass", _DISPATCH_MODULES,
        lambda q: f"uses {q} (torch function/dispatch modes) to intercept PyTorch calls; return plain tensors")
    subclasses: set[str] = set()
    for _ in range(len(module.classes) + 1):  # fixpoint over local inheritance
        for name, cls in module.classes.items():
            if any((module.qualname(b) or "") in TENSOR_BASES or getattr(b, "id", None) in subclasses
                   for b in cls.bases):
                subclasses.add(name)
    for node in module.nodes:
        if isinstance(node, ast.ClassDef) and (node.name in subclasses or any(
                (module.qualname(b) or "") in TENSOR_BASES for b in node.bases)):
            out.append(_v("tensor-subclass", module, node,
                          f"class {node.name} subclasses torch.Tensor and can fake values or comparisons; "
                          "return plain tensors"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _SUBCLASS_ATTRIBUTES:
            out.append(_v("tensor-subclass", module, node,
                          f"defines {node.name}, intercepting PyTorch calls; return plain tensors"))
        elif isinstance(node, ast.Attribute) and node.attr in _SUBCLASS_ATTRIBUTES:
            out.append(_v("tensor-subclass", module, node,
                          f"uses {snippet(node)} to build tensor subclasses; return plain tensors"))
    return out


# -- file-or-network ---------------------------------------------------------------------------------
def check_file_or_network(module: PyModule) -> list[Violation]:
    out = _imports_and_references(
        module, "file-or-network", NETWORK_MODULES + _FILE_WRITES,
        lambda q: f"uses {q} (files or network); a solution only computes, it writes no files and opens no sockets")
    for node, qual in module.call_targets:
        is_open = module.is_builtin(node.func, "open") or qual in _OPENERS or (
            qual is None and isinstance(node.func, ast.Attribute) and node.func.attr == "open")
        if is_open:
            message = _open_problem(node, method=qual is None and not module.is_builtin(node.func, "open"))
            if message:
                out.append(_v("file-or-network", module, node, message))
        elif qual is None and isinstance(node.func, ast.Attribute) and node.func.attr in _PATH_WRITES:
            out.append(_v("file-or-network", module, node,
                          f"{snippet(node.func)}() changes the file system; a solution writes no files"))
        elif qual == "logging.basicConfig" and any(kw.arg == "filename" for kw in node.keywords):
            out.append(_v("file-or-network", module, node,
                          "logging.basicConfig(filename=...) writes a log file; a solution writes no files"))
    return out


def _open_problem(node: ast.Call, method: bool) -> str | None:
    path = None if method or not node.args else node.args[0]
    mode_pos = 0 if method else 1
    mode = node.args[mode_pos] if len(node.args) > mode_pos else None
    for kw in node.keywords:
        if kw.arg == "mode":
            mode = kw.value
        elif kw.arg in ("file", "name", "filename"):
            path = kw.value
    if isinstance(path, ast.Constant) and isinstance(path.value, str) and path.value.startswith(("/proc", "/dev",
                                                                                                   "/sys")):
        return f"opens {path.value}, reaching into process memory or devices; remove it"
    if mode is None:
        return None
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
        return f"{snippet(node.func)}() with a computed mode may write files; open read-only with a literal mode"
    if any(c in mode.value.split(":")[0] for c in "wax+"):  # tarfile's "r:xz" reads
        return f"{snippet(node.func)}() opens a file for writing (mode {mode.value!r}); a solution writes no files"
    return None


# -- stream-creation ---------------------------------------------------------------------------------
def check_stream_creation(module: PyModule, config: GuardConfig) -> list[Violation]:
    if config.allow_streams:
        return []
    return _imports_and_references(
        module, "stream-creation", STREAM_APIS,
        lambda q: f"uses {q}; work on another stream or in a captured graph can escape the timed region, so run "
                  "on the current stream")


# -- unverifiable-source ------------------------------------------------------------------------------
_CPP_EXTENSION = "torch.utils.cpp_extension"
_CPP_EXTENSION_OK = frozenset({f"{_CPP_EXTENSION}.{n}" for n in (
    "load_inline", "load", "CUDA_HOME", "ROCM_HOME", "include_paths", "library_paths", "is_ninja_available",
    "verify_ninja_availability")} | {_CPP_EXTENSION})


def check_unverifiable_source(module: PyModule, extension_built: bool) -> list[Violation]:
    out = [Violation("unverifiable-source", p) for call in module.load_calls for p in call.problems]
    if not extension_built:
        out += [_v("unverifiable-source", module, rec.node,
                   f"imports {EXTENSION_NAME}, but this solution has no kernels/*_binding.cpp nor launchers to build it from, so "
                   "whatever module is found would run unscanned; build with load_inline or add kernels/")
                for rec in module.imports if rec.module.split(".")[0] == EXTENSION_NAME]
    called = {id(node.func) for node, _ in module.call_targets}
    for node, qual in module.references:
        if not qual.startswith(_CPP_EXTENSION):
            continue
        if qual not in _CPP_EXTENSION_OK:
            out.append(_v("unverifiable-source", module, node,
                          f"uses {qual}; build the extension only with load_inline/load and literal sources"))
        elif qual.rsplit(".", 1)[-1] in ("load_inline", "load") and id(node) not in called \
                and not isinstance(node.ctx, ast.Store):
            out.append(_v("unverifiable-source", module, node,
                          f"passes {qual} around instead of calling it, so the guards cannot read its sources; "
                          "call it directly with literal sources"))
    for rec in module.imports:
        root = rec.module.split(".")[0]
        parts = [p for p in rec.target.split(".") if p]
        if any(p in REFERENCE_MODULES for p in parts):
            continue  # inherits-reference reports it
        if rec.module.startswith(".") or root not in _IMPORTABLE:
            out.append(_v("unverifiable-source", module, rec.node,
                          f"imports {rec.module or rec.target}, code the guards do not scan; keep all code in the "
                          "solution file and your extension"))
    return out


def library_links(module: PyModule, config: GuardConfig) -> list[Violation]:
    """``-l<vendor library>`` in ``extra_ldflags`` for a library that is not allowed (``library-call``)."""
    out = []
    for call in module.load_calls:
        for lib in call.libraries:
            if lib in KNOWN_LIBRARIES and lib not in config.allowed_libraries:
                out.append(_v("library-call", module, call.node,
                              f"links {lib}, which is not in allowed_libraries {list(config.allowed_libraries)}; "
                              "write the kernel yourself"))
    return out


# -- torch-compute-fallback (module-wide part; forward itself is ForwardAnalysis's) ----------------------
def check_torch_compilers(module: PyModule) -> list[Violation]:
    out = []
    for rec in module.imports:
        if rec.bound == "*" and rec.module.split(".")[0] == "torch":
            out.append(_v("torch-compute-fallback", module, rec.node,
                          f"'from {rec.module} import *' hides which PyTorch ops forward calls; import names "
                          "explicitly"))
    return out + _imports_and_references(
        module, "torch-compute-fallback", _TORCH_COMPILERS,
        lambda q: f"uses {q}, which makes PyTorch generate or register the compute; write it in your extension",
        exclude=_BENIGN_TORCH_COMPILER_NAMES)

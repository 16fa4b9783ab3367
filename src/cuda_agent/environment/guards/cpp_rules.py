"""The C++/CUDA halves of the static guards: one check function per violation code, over tokens.

Comments are gone and literals are single tokens, so only code is judged. Each function takes a
``CppUnit`` and the bundle-wide ``CppContext`` and returns violations whose messages start with
``file:line``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cuda_agent.environment.guards.config import GuardConfig
from cuda_agent.environment.guards.cpp_lexer import Token
from cuda_agent.environment.guards.cpp_model import CURRENT_STREAM, KEYWORDS, TYPE_WORDS, CppUnit
from cuda_agent.environment.guards.vocabulary import (
    CPP_ALLOWED_HEADS, CPP_ALLOWED_PATHS, CPP_ALLOWED_TENSOR_METHODS, CPP_COMMON_FREE_FUNCTIONS,
    CPP_COMPUTE_NAMESPACES, CPP_CONTAINER_METHOD_NAMES, CPP_ROOTS, aten_compute_names,
)
from cuda_agent.environment.verdict import Violation

STREAM_NAMES = frozenset({
    "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority", "cuStreamCreate",
    "cuStreamCreateWithPriority", "getStreamFromPool", "getStreamFromExternal", "setCurrentCUDAStream",
    "CUDAStreamGuard", "CUDAMultiStreamGuard", "OptionalCUDAStreamGuard", "cudaStreamBeginCapture",
    "cudaStreamBeginCaptureToGraph", "cuStreamBeginCapture", "cudaGraphCreate", "cudaGraphInstantiate",
    "cudaGraphInstantiateWithFlags", "cudaGraphLaunch", "cuGraphLaunch", "cudaStreamPerThread", "cudaStreamLegacy",
    "CUDAGraph",
})
_LIBRARY_PREFIXES = (("cublasLt", "cublasLt"), ("cublasXt", "cublas"), ("cublas", "cublas"), ("cudnn", "cudnn"),
                     ("cufft", "cufft"), ("cusparseLt", "cusparse"), ("cusparse", "cusparse"), ("curand", "curand"),
                     ("cusolver", "cusolver"), ("cutensor", "cutensor"), ("nccl", "nccl"))
_LIBRARY_HANDLES = {"getCurrentCUDABlasHandle": "cublas", "getCurrentCUDABlasLtHandle": "cublasLt",
                    "getCurrentCUDASparseHandle": "cusparse", "getCurrentCUDASolverDnHandle": "cusolver",
                    "getCudnnHandle": "cudnn"}
CONCURRENCY_CALLS = frozenset({"pthread_create", "thrd_create", "fork", "vfork", "clone", "clone3", "system",
                               "popen", "execl", "execle", "execlp", "execv", "execve", "execvp", "execvpe", "fexecve",
                               "posix_spawn", "posix_spawnp", "_beginthread", "CreateThread", "timer_create", "signal",
                               "sigaction", "sigset", "sysv_signal", "bsd_signal"})
CONCURRENCY_STD = frozenset({"thread", "jthread", "async", "system", "packaged_task"})
FILE_CALLS = frozenset({"fopen", "fopen64", "freopen", "fdopen", "tmpfile", "tmpfile64", "tmpnam", "mkstemp",
                        "mkostemp", "mkdtemp", "open", "open64", "openat", "creat", "unlink", "unlinkat", "remove",
                        "rename", "renameat", "rmdir", "mkdir", "truncate", "ftruncate", "chmod", "syscall", "write",
                        "pwrite", "pwrite64", "writev", "pwritev", "pwritev2", "dup", "dup2", "dup3", "fcntl",
                        "sendfile", "splice", "copy_file_range", "socket", "connect", "bind", "listen", "accept",
                        "send", "sendto", "recv", "recvfrom", "getaddrinfo", "gethostbyname", "mmap", "shm_open",
                        "memfd_create", "process_vm_readv", "process_vm_writev", "ptrace"})
FILE_STD = frozenset({"ofstream", "ifstream", "fstream", "basic_ofstream", "basic_ifstream", "basic_fstream",
                      "filesystem", "filebuf", "basic_filebuf"})
_STD_HOMONYMS = frozenset({"bind"})
"""C library names whose ``std::`` spelling is something else (``std::bind`` binds arguments)."""
DYNAMIC_NAMES = frozenset({"dlopen", "dlsym", "dlmopen", "dlvsym", "cudaGetDriverEntryPoint",
                           "cudaGetDriverEntryPointByVersion", "cuGetProcAddress", "cuGetProcAddress_v2",
                           "LoadLibrary", "LoadLibraryA", "LoadLibraryW", "GetProcAddress", "cuModuleLoad",
                           "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData",
                           "cuLibraryLoadFromFile", "cudaLibraryLoadData", "cudaLibraryLoadFromFile", "cuLinkCreate"})
DYNAMIC_PREFIXES = ("nvrtc", "cuModuleLoad", "cuLibraryLoad", "cudaLibraryLoad")
PYTHON_API_PREFIXES = ("PyRun_", "PyImport_", "PyEval_", "PyObject_Call", "PyObject_Vectorcall", "PyVectorcall_",
                       "PyObject_GetAttr", "PyCFunction_Call", "Py_CompileString")
_PYBIND_PYTHON = frozenset({"import", "eval", "exec", "eval_file", "globals", "getattr"})
_PYBIND_SCOPES = frozenset({"py", "pybind11", "module_", "module", "object"})
_SYSCALL_ASM = re.compile(r"\b(syscall|sysenter|svc|incbin)\b|int\s+\$?0x80")
_INCLUDE_PREFIXES = ("torch/", "ATen/", "c10/", "cuda", "cub/", "thrust/", "cutlass/", "cute/", "cublas", "cudnn",
                     "curand", "cufft", "cusparse", "cusolver", "mma.h", "nv", "sm_", "crt/", "pybind11/", "device_",
                     "vector_types", "math_", "cooperative_groups", "Python.h", "library_types", "driver_types")
HARNESS_HEADERS = frozenset({"../binding_registry.h", "binding_registry.h"})
"""Headers the protected build writes itself (the released layout's binding registry,
``environment/binding_registry.py``): including them reaches no candidate-controlled file."""
TORCH_NAMESPACES = frozenset({"aten", "prims", "quantized", "_c10d_functional", "c10d", "torchvision", "_quantized",
                              "sparse", "mkldnn", "_test", "profiler", "inductor", "higher_order"})
_BINARY_OPS = frozenset({"+", "-", "*", "/", "%", "==", "!=", "<", ">", "<=", ">=", "+=", "-=", "*=", "/=", "%=",
                         "&", "|", "^", "&=", "|=", "^="})


@dataclass(frozen=True)
class CppContext:
    """What the C++ rules need to know beyond one unit."""

    config: GuardConfig
    defined_functions: frozenset[str]
    """Functions the solution itself defines (an unqualified call to one of them is not ATen)."""
    files: frozenset[str]
    """Paths and file names of the solution's C++/CUDA files (for quoted ``#include``)."""
    custom_namespaces: frozenset[str] = frozenset()
    """Operator namespaces the solution defines with ``TORCH_LIBRARY(ns, m)``."""


def _v(code: str, unit: CppUnit, token: Token, message: str) -> Violation:
    return Violation(code, f"{unit.where(token)}: {message}")


def _free_call(unit: CppUnit, i: int) -> bool:
    """Token ``i`` is an unqualified (or ``::``-qualified global) function call ``name(``."""
    before = unit.text(i - 1)
    if before in (".", "->"):
        return False
    if before == "::" and i >= 2 and unit.tokens[i - 2].kind == "id":
        return False
    return unit.text(i + 1) == "(" and unit.text(i - 1) not in TYPE_WORDS


def _c_library_use(unit: CppUnit, i: int) -> bool:
    """Token ``i`` names a C library function, unqualified or as ``::name`` / ``std::name``: called
    (``write(``) or taken as a value (``&system``, ``= system``, ``return system``); not a member, a
    declaration's type, a variable in scope, nor the ``std::remove`` algorithm."""
    name = unit.text(i)
    j = i - 1
    if unit.text(j) == "::" and j >= 1 and unit.tokens[j - 1].kind == "id":
        if not unit.is_std(j - 1) or name in _STD_HOMONYMS:
            return False
        j -= 2
    qualified = unit.text(j) == "::" or j < i - 1
    if unit.text(j) == "::":
        j -= 1
    before = unit.text(j)
    if before in (".", "->") or before in TYPE_WORDS:
        return False
    if unit.text(i + 1) == "(":
        return name != "remove" or len(unit.arguments(i + 1)) == 1  # remove(first, last, value) is <algorithm>
    return before in ("&", "=", "return") and (qualified or not unit.names_a_variable(i))


def _std_name(unit: CppUnit, i: int) -> bool:
    """Token ``i`` is ``std::<name>`` (or ``<alias of std>::<name>``)."""
    return unit.text(i - 1) == "::" and unit.is_std(i - 2)


def _bare_std_name(unit: CppUnit, i: int) -> bool:
    """Token ``i`` is a ``std::`` type or function written without the prefix after ``using namespace
    std``, and used as one: ``thread t(...)``, ``thread* p``, ``vector<thread>``, ``async(...)``; not
    a member or a variable of that name."""
    if not unit.using_std or unit.text(i - 1) in (".", "->", "::") or unit.names_a_variable(i):
        return False
    after = unit.text(i + 1)
    declares = i + 1 < len(unit.tokens) and unit.tokens[i + 1].kind == "id"  # thread t(...)
    template_argument = unit.text(i - 1) in ("<", ",") and after in (">", ",")  # vector<thread>
    return declares or template_argument or after in ("(", "{", "::", "<", "*", "&", "&&")


# -- aten-compute-fallback ---------------------------------------------------------------------------
def allowed_aten_path(parts: list[str]) -> bool:
    """``parts`` (the name below torch::/at::/c10::) may be used in host code."""
    path = "::".join(parts)
    if not parts or path in CPP_ALLOWED_PATHS or parts[0] in CPP_ALLOWED_HEADS:
        return True
    last = parts[-1]
    if last in STREAM_NAMES or last in _LIBRARY_HANDLES:
        return True  # the stream-creation and library-call rules judge these
    return len(last) > 1 and last[0] == "k" and last[1].isupper()  # constants: kFloat32, kCUDA


def check_aten(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    out = []
    vocabulary = aten_compute_names()
    t = unit.text
    skip_until = -1
    for i, tok in enumerate(unit.tokens):
        if i <= skip_until or tok.kind != "id" or t(i - 1) in (".", "->"):
            continue
        if (t(i - 1) != "::" or unit.tokens[i - 2].kind != "id") and (tok.text in CPP_ROOTS or tok.text in unit.aliases):
            parts, last = unit.chain(i)
            skip_until = last
            message = _aten_chain_problem(unit, i, parts, last, vocabulary)
            if message:
                out.append(_v("aten-compute-fallback", unit, tok, message))
            continue
        if not unit.is_host(i):
            continue
        if _free_call(unit, i) and tok.text in vocabulary and tok.text not in ctx.defined_functions \
                and tok.text not in KEYWORDS:
            tensor_arg = any(_is_tensor_argument(unit, arg) for arg in unit.arguments(i + 1))
            if tensor_arg or (unit.using_aten and tok.text not in CPP_COMMON_FREE_FUNCTIONS):
                out.append(_v("aten-compute-fallback", unit, tok,
                              f"calls {tok.text}(...) on tensors, which resolves to the ATen op; compute it in "
                              "your kernel"))
    out += _tensor_methods_and_operators(unit, vocabulary)
    return out


def _aten_chain_problem(unit: CppUnit, i: int, parts: list[str], last: int, vocabulary: frozenset[str]) -> str | None:
    root, below = parts[0], parts[1:]
    name = "::".join(parts)
    if not below:
        if unit.text(i - 2).startswith("TORCH_LIBRARY"):
            return None  # the namespace of an operator library (monkeypatch judges overrides)
        if unit.text(last + 1) in (",", ")") and unit.text(i - 1) in ("(", ","):
            return f"passes the namespace {root} as an argument (a macro can build ATen calls from it); remove it"
        return None
    if root not in CPP_ROOTS:
        return None
    if any(p in CPP_COMPUTE_NAMESPACES or p == "blas" for p in below[:-1]) or below[0] in CPP_COMPUTE_NAMESPACES:
        return f"uses {name}, ATen's own compute; write the computation in your kernel"
    if allowed_aten_path(below):
        return None
    if unit.is_call(last):
        return f"calls {name}, an ATen op outside the allow-list; compute it in your kernel (allowed: docs/guards.md)"
    if below[-1] in vocabulary:
        return f"refers to {name}, an ATen compute op; compute it in your kernel"
    return None


def _is_tensor_argument(unit: CppUnit, arg: list[int]) -> bool:
    return bool(arg) and unit.tensor_expression_ends_at(arg[-1]) and (
        len(arg) == 1 or unit.tensor_var(arg[0]))


def _tensor_methods_and_operators(unit: CppUnit, vocabulary: frozenset[str]) -> list[Violation]:
    out = []
    t = unit.text
    for i, tok in enumerate(unit.tokens):
        if not unit.is_host(i):
            continue
        if tok.text in (".", "->") and i + 1 < len(unit.tokens) and unit.tokens[i + 1].kind == "id" \
                and unit.is_call(i + 1):
            name = t(i + 1)
            receiver_is_tensor = unit.tensor_expression_ends_at(i - 1)
            if receiver_is_tensor and name not in CPP_ALLOWED_TENSOR_METHODS:
                out.append(_v("aten-compute-fallback", unit, tok,
                              f"calls .{name}() on a tensor, an ATen op outside the allow-list; compute it in your "
                              "kernel"))
            elif not receiver_is_tensor and name in vocabulary and name not in CPP_CONTAINER_METHOD_NAMES:
                out.append(_v("aten-compute-fallback", unit, tok,
                              f"calls .{name}(), an ATen op name, in host code; compute it in your kernel"))
        elif tok.text in _BINARY_OPS and _tensor_operator(unit, i):
            out.append(_v("aten-compute-fallback", unit, tok,
                          f"applies '{tok.text}' to a torch::Tensor, which runs an ATen op; compute it in your "
                          "kernel"))
    return out


def _tensor_operator(unit: CppUnit, i: int) -> bool:
    """The operator at token ``i`` has a tensor operand (``x * 2``, ``2 * x``, ``-x``, ``x.view(-1) + y``)."""
    if i >= 1 and unit.tensor_expression_ends_at(i - 1):
        return True
    t = unit.text
    if not (i + 1 < len(unit.tokens) and unit.tensor_var(i + 1) and t(i + 2) not in (".", "->", "[", "(", "::")):
        return False
    prev = unit.tokens[i - 1] if i >= 1 else None
    operand_before = prev is not None and (
        prev.kind == "num" or prev.text in (")", "]")
        or (prev.kind == "id" and prev.text not in TYPE_WORDS and prev.text not in KEYWORDS))
    if t(i) in ("-", "+") and (prev is None or prev.text in ("(", ",", "=", "return", "?", ":", "{", "[")):
        return True  # unary minus/plus
    return operand_before  # after a type name, * and & declare a pointer or reference


# -- stream-creation ---------------------------------------------------------------------------------
def check_streams(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    if ctx.config.allow_streams:
        return []
    out = []
    for i, tok in enumerate(unit.tokens):
        if tok.kind == "id" and tok.text in STREAM_NAMES:
            out.append(_v("stream-creation", unit, tok,
                          f"uses {tok.text}; work on another stream or in a graph can escape the timed region, so "
                          "launch on at::cuda::getCurrentCUDAStream()"))
        elif tok.text == "<" and _launch_at(unit, i):
            problem = _launch_stream_problem(unit, i)
            if problem:
                out.append(_v("stream-creation", unit, tok, problem))
    return out


def _launch_at(unit: CppUnit, i: int) -> bool:
    toks = unit.tokens
    return (i + 2 < len(toks) and toks[i + 1].text == "<" and toks[i + 2].text == "<"
            and toks[i + 1].start == toks[i].start + 1 and toks[i + 2].start == toks[i].start + 2
            and (i == 0 or toks[i - 1].text != "<" or toks[i - 1].start != toks[i].start - 1))


def _launch_stream_problem(unit: CppUnit, i: int) -> str | None:
    args: list[list[int]] = [[]]
    j = i + 3
    depth = 0
    while j < len(unit.tokens) and j < i + 400:
        text = unit.text(j)
        if depth == 0 and text == ">" and unit.text(j + 1) == ">" and unit.text(j + 2) == ">":
            break
        depth += text in ("(", "[", "{")
        depth -= text in (")", "]", "}")
        if depth == 0 and text == ",":
            args.append([])
        else:
            args[-1].append(j)
        j += 1
    if len(args) < 4 or not args[3]:
        return None
    stream = [unit.text(k) for k in args[3]]
    for _ in range(4):  # expand object-like macros (#define STREAM at::cuda::getCurrentCUDAStream())
        stream = [part for text in stream for part in unit.macros.get(text, [text])]
    scope = unit.scope_at[i]
    if stream in (["0"], ["nullptr"], ["NULL"], ["0", "u"]) or CURRENT_STREAM & set(stream):
        return None
    if scope is not None and stream[0] in scope.current_streams:
        return None
    return (f"launches a kernel on stream '{' '.join(stream)}', which is not the current stream; pass "
            "at::cuda::getCurrentCUDAStream() or, in a launcher, cuda_agent_stream(call) (or a variable initialised "
            "from it)")


# -- library-call ------------------------------------------------------------------------------------
def check_libraries(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    out = []
    allowed = set(ctx.config.allowed_libraries)
    for i, tok in enumerate(unit.tokens):
        if tok.kind != "id" or unit.text(i + 1) != "(":
            continue
        library = _LIBRARY_HANDLES.get(tok.text) or next(
            (lib for prefix, lib in _LIBRARY_PREFIXES if tok.text.startswith(prefix)), None)
        if library is not None and library not in allowed:
            out.append(_v("library-call", unit, tok,
                          f"calls {tok.text} ({library}), which is not in allowed_libraries {sorted(allowed)}; "
                          "write the kernel yourself"))
    return out


# -- token-pasting -----------------------------------------------------------------------------------
def check_token_pasting(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    out = []
    vocabulary = aten_compute_names()
    for line in unit.directives:
        if len(line) < 3 or line[1].text != "define":
            continue
        if any(tok.text == "##" for tok in line):
            out.append(_v("token-pasting", unit, line[0],
                          f"#define {line[2].text} pastes tokens with ##, which can build forbidden names; write "
                          "names out"))
            continue
        body = line[3:]
        if body and body[0].text == "(" and body[0].start == line[2].start + len(line[2].text):
            close = next((k for k, tok in enumerate(body) if tok.text == ")"), len(body) - 1)
            body = body[close + 1:]
        reason = _forbidden_in_macro(body, ctx, vocabulary)
        if reason:
            out.append(_v("token-pasting", unit, line[0],
                          f"#define {line[2].text} expands to {reason}; use the name directly where it is allowed"))
    t = unit.text
    for i, tok in enumerate(unit.tokens):
        if tok.text == "__attribute__" and t(i + 1) == "(" and t(i + 2) == "(":
            inner = [t(k) for k in range(i + 3, unit.match.get(i + 1, i + 3))]
            if {"constructor", "destructor", "__constructor__", "__destructor__"} & set(inner) or any(
                    "init_array" in s or "fini_array" in s for s in inner):
                out.append(_v("token-pasting", unit, tok,
                              "__attribute__((constructor)) runs code when the library loads; do all work in the "
                              "functions forward calls"))
        elif tok.text == "gnu" and t(i + 1) == "::" and t(i + 2) in ("constructor", "destructor") and t(i - 1) == "[":
            out.append(_v("token-pasting", unit, tok, "[[gnu::constructor]] runs code when the library loads; remove it"))
        elif tok.text in ("asm", "__asm__", "__asm"):
            j = i + 1
            while t(j) in ("volatile", "__volatile__", "goto", "inline"):
                j += 1
            if t(j) == "(":
                literals = [unit.tokens[k].text for k in range(j, unit.match.get(j, j)) if unit.tokens[k].kind == "str"]
                if any(_SYSCALL_ASM.search(s) for s in literals):
                    out.append(_v("token-pasting", unit, tok,
                                  "inline assembly makes a system call (or embeds a file); use only compute "
                                  "instructions"))
    return out


def _forbidden_in_macro(body: list[Token], ctx: CppContext, vocabulary: frozenset[str]) -> str | None:
    texts = [tok.text for tok in body]
    for k, text in enumerate(texts):
        if body[k].kind != "id":
            continue
        before = texts[k - 1] if k else ""
        after = texts[k + 1] if k + 1 < len(texts) else ""
        if text in CPP_ROOTS and before not in ("::", ".", "->"):
            parts = [text]
            j = k
            while j + 2 < len(texts) and texts[j + 1] == "::" and body[j + 2].kind == "id":
                parts.append(texts[j + 2])
                j += 2
            if len(parts) == 1 or not allowed_aten_path(parts[1:]) or any(
                    p in CPP_COMPUTE_NAMESPACES for p in parts[1:]):
                return f"{'::'.join(parts)} (an ATen name or namespace)"
        elif text in STREAM_NAMES or text in DYNAMIC_NAMES or text.startswith(DYNAMIC_PREFIXES + PYTHON_API_PREFIXES):
            return text
        elif text == "attr" and before in (".", "->"):
            return f"{before}attr (a call into Python)"
        elif before not in (".", "->", "::") and after == "(" and text not in ctx.defined_functions and (
                text in CONCURRENCY_CALLS or text in FILE_CALLS or (
                    text in vocabulary and text not in CPP_COMMON_FREE_FUNCTIONS)):
            return f"a call to {text}"
        elif after == "(" and (text in _LIBRARY_HANDLES or any(text.startswith(p) for p, _ in _LIBRARY_PREFIXES)):
            library = _LIBRARY_HANDLES.get(text) or next(lib for p, lib in _LIBRARY_PREFIXES if text.startswith(p))
            if library not in ctx.config.allowed_libraries:
                return f"a call to {text} ({library})"
    return None


# -- monkeypatch -------------------------------------------------------------------------------------
def check_operator_overrides(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    """``TORCH_LIBRARY_IMPL`` / ``TORCH_LIBRARY_FRAGMENT`` on a namespace the solution did not define
    (``aten``): registering kernels for PyTorch's own operators changes what they do."""
    out = []
    for i, tok in enumerate(unit.tokens):
        if tok.text in ("TORCH_LIBRARY_IMPL", "TORCH_LIBRARY_FRAGMENT") and unit.text(i + 1) == "(":
            namespace = unit.text(i + 2)
            if namespace not in ctx.custom_namespaces or namespace in TORCH_NAMESPACES:
                out.append(_v("monkeypatch", unit, tok,
                              f"{tok.text}({namespace}, ...) registers kernels for operators the solution does not "
                              "own, changing PyTorch for everyone in the process; define your own TORCH_LIBRARY"))
    return out


# -- concurrency / file-or-network / dynamic-code / python-from-cpp -------------------------------------
def _check_named_calls(unit: CppUnit, ctx: CppContext, std_names, free_calls, code: str, advice: str) -> list[Violation]:
    """Uses of the ``std::`` names ``std_names`` (with the prefix, or without it after ``using
    namespace std``) and of the C functions ``free_calls`` the solution does not define."""
    out = []
    for i, tok in enumerate(unit.tokens):
        if tok.kind != "id" or (tok.text in ctx.defined_functions and not _std_name(unit, i)):
            continue
        if (_std_name(unit, i) and tok.text in std_names) or (tok.text in free_calls and _c_library_use(unit, i)) \
                or (tok.text in std_names and _bare_std_name(unit, i)):
            name = f"std::{tok.text}" if _std_name(unit, i) else tok.text
            out.append(_v(code, unit, tok, f"uses {name} {advice}"))
    return out


def check_concurrency(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    return _check_named_calls(unit, ctx, CONCURRENCY_STD, CONCURRENCY_CALLS, "concurrency",
                              "(threads, processes or signal handlers); do the work in kernels on the current stream")


def check_files(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    return _check_named_calls(unit, ctx, FILE_STD, FILE_CALLS, "file-or-network",
                              "(files, file descriptors, sockets or process memory); a kernel only computes")


def check_dynamic(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    return [_v("dynamic-code", unit, tok,
               f"uses {tok.text}, which loads or runs code the guards cannot read; write it as source")
            for tok in unit.tokens
            if tok.kind == "id" and (tok.text in DYNAMIC_NAMES or tok.text.startswith(DYNAMIC_PREFIXES))]


def check_python_calls(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    """Python reached from C++: the CPython API, pybind11's import/eval/getattr, and ``obj.attr(...)``
    other than assigning a module attribute (``m.attr("BLOCK") = 256``)."""
    out = []
    t = unit.text
    for i, tok in enumerate(unit.tokens):
        if tok.kind != "id":
            continue
        if tok.text.startswith(PYTHON_API_PREFIXES):
            name = tok.text
        elif tok.text in _PYBIND_PYTHON and t(i - 1) == "::" and t(i - 2) in _PYBIND_SCOPES:
            name = f"{t(i - 2)}::{tok.text}"
        elif tok.text == "attr" and t(i - 1) in (".", "->") and t(i + 1) == "(" \
                and t(unit.match.get(i + 1, i) + 1) != "=":
            name = f"{t(i - 1)}attr(...)"
        else:
            continue
        out.append(_v("python-from-cpp", unit, tok,
                      f"uses {name}: kernels may not call back into Python; that is how a torch fallback hides in "
                      "C++"))
    return out


# -- unverifiable-source -----------------------------------------------------------------------------
def check_includes(unit: CppUnit, ctx: CppContext) -> list[Violation]:
    out = []
    for line in unit.directives:
        if len(line) < 2 or line[1].text not in ("include", "include_next", "import", "embed"):
            continue
        if line[1].text == "embed":
            out.append(_v("unverifiable-source", unit, line[0], "#embed pulls in a file the guards cannot read"))
            continue
        target = line[2] if len(line) > 2 else None
        if target is None:
            continue
        if target.kind == "str":
            path = target.text.strip('"')
            angled = False
        elif target.text == "<":
            path = "".join(tok.text for tok in line[3:] if tok.text != ">")
            angled = True
        else:
            out.append(_v("unverifiable-source", unit, line[0],
                          "#include of a macro hides which file is included; name the header"))
            continue
        if path in HARNESS_HEADERS:
            continue
        if path.startswith("/") or ".." in path.split("/"):
            out.append(_v("unverifiable-source", unit, line[0],
                          f"#include {path} reaches outside the solution; include only headers in kernels/ or "
                          "system/torch/CUDA headers"))
        elif not angled and path not in ctx.files and path.rsplit("/", 1)[-1] not in ctx.files \
                and not path.startswith(_INCLUDE_PREFIXES):
            out.append(_v("unverifiable-source", unit, line[0],
                          f"#include \"{path}\" is not a file of the solution, so the guards cannot read it; put it "
                          "in kernels/"))
    return out

"""Python-side static guards: each cheat is caught with its code, each near miss passes clean.

Every case starts with a comment that explains the trick (or why the near miss is honest).
"""

from __future__ import annotations

import textwrap

import pytest

from cuda_agent.environment.guards import GuardConfig

HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

_ext = load_inline(name="k", cpp_sources="torch::Tensor f(torch::Tensor x, torch::Tensor y);", functions=["f"])
'''



def solution(body: str) -> str:
    """A single-file solution: the common imports and extension, then ``body``."""
    return HEAD + textwrap.dedent(body)


CHEATS = {
    "torch-compute-fallback": [
        ("torch_matmul", '''
        # The whole task done by PyTorch: forward never touches the extension's compute.
        class ModelNew(nn.Module):
            def forward(self, a, b):
                return torch.matmul(a, b)
        '''),
        ("functional_alias", '''
        # F is torch.nn.functional: resolved through the import alias.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(F.relu(x), y)
        '''),
        ("tensor_method", '''
        # A reduction as a tensor method (deny by default: .sum is not on the allow-list).
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y).sum(dim=-1)
        '''),
        ("operator_on_tensor", '''
        # The kernel does half the work; the epilogue is PyTorch arithmetic.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y) * 2 + y
        '''),
        ("nn_layer_called", '''
        # nn.Linear held as an attribute and called: cuBLAS through PyTorch, not the candidate.
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
            def forward(self, x, y):
                return _ext.f(self.fc(x), y)
        '''),
        ("helper_function", '''
        # The fallback hides in a module-level helper that forward calls.
        def _epilogue(t):
            return t @ t
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _epilogue(_ext.f(x, y))
        '''),
        ("local_submodule", '''
        # A local nn.Module whose forward is PyTorch, called from ModelNew.forward.
        class Act(nn.Module):
            def forward(self, t):
                return torch.tanh(t)
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = Act()
            def forward(self, x, y):
                return self.act(_ext.f(x, y))
        '''),
        ("torch_as_value", '''
        # The op is never called by name: it is handed to map().
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return list(map(torch.relu, [x]))[0]
        '''),
        ("torch_compile", '''
        # torch.compile generates the kernels (Triton), not the candidate.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        fast = torch.compile(ModelNew())
        '''),
        ("getattr_computed", '''
        # The op name is assembled at run time so no token names it.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return getattr(torch, "mat" + "mul")(x, y)
        '''),
        ("extension_name_rebound", '''
        # The name that held the extension is rebound to torch.nn.functional.
        _ext = F
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.conv2d(x, y)
        '''),
        ("inherited_layer_forward", '''
        # ModelNew has no forward of its own: nn.Linear's runs.
        class ModelNew(nn.Linear):
            def __init__(self):
                super().__init__(8, 8)
        '''),
    ],
    "inherits-reference": [
        ("subclass_imported_model", '''
        # Inherits the reference's forward: the answer key as the answer.
        from model import Model
        class ModelNew(Model):
            pass
        '''),
        ("subclass_local_copy", '''
        # A copy of the reference in the same file, inherited through an intermediate class.
        class Model(nn.Module):
            def forward(self, x, y):
                return x @ y
        class Base(Model):
            pass
        class ModelNew(Base):
            pass
        '''),
        ("import_reference_module", '''
        # Calls the reference module directly.
        import model
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "exception-fallback": [
        ("try_in_forward", '''
        # If the kernel raises (unsupported shape), PyTorch silently takes over.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                try:
                    return _ext.f(x, y)
                except RuntimeError:
                    return x
        '''),
        ("try_in_helper", '''
        # The try/except is one call away from forward.
        def _run(x, y):
            try:
                return _ext.f(x, y)
            except Exception:
                return y
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _run(x, y)
        '''),
        ("contextlib_suppress", '''
        # contextlib.suppress swallows the kernel's error.
        import contextlib
        class ModelNew(nn.Module):
            def forward(self, x, y):
                out = torch.empty_like(x)
                with contextlib.suppress(Exception):
                    out = _ext.f(x, y)
                return out
        '''),
    ],
    "concurrency": [
        ("threading", '''
        # A background thread keeps working outside the timed region.
        import threading
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("os_system", '''
        # Shelling out from the candidate process.
        import os
        os.system("nvidia-smi")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("executor", '''
        # A process pool imported by name.
        from concurrent.futures import ProcessPoolExecutor
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "dynamic-code": [
        ("exec", '''
        # Code in a string is code the guards never saw.
        exec("import torch")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("dunder_import", '''
        # __import__ hides the module being imported.
        _t = __import__("torch")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("getattr_on_module", '''
        # A computed attribute of a module.
        name = "rel" + "u"
        _op = getattr(torch, name)
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("globals_write", '''
        # Defines names through globals() where no assignment shows them.
        globals()["helper"] = print
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("load_library", '''
        # A prebuilt binary the guards cannot read.
        torch.ops.load_library("libcheat.so")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "monkeypatch": [
        ("tf32_switch", '''
        # Turns TF32 on for everyone in the process (the precision check runs in the same process).
        torch.backends.cuda.matmul.allow_tf32 = True
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("patch_timer", '''
        # Freezes the clock the harness might read.
        import time
        time.perf_counter = lambda: 0.0
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("setattr_on_torch", '''
        # Replaces a torch function the checker uses.
        setattr(torch, "allclose", lambda *a, **k: True)
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("instance_forward", '''
        # An instance attribute shadows the checked forward method.
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.forward = lambda x, y: x
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("instance_dict_write", '''
        # Writes the shadowing forward straight into the instance dictionary.
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.__dict__["forward"] = torch.relu
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("forward_hook", '''
        # A hook rewrites the output after the (honest) forward.
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_forward_hook(lambda m, i, o: o)
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("rebind_model_new", '''
        # The class the harness instantiates is not the one defined (and checked) above.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        ModelNew = nn.Identity
        '''),
        ("patch_extension_function", '''
        # The extension is built honestly, then its function is swapped for a torch op.
        _ext.f = torch.matmul
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("environment", '''
        # Changes the environment of the process the harness runs in.
        import os
        os.environ["CUDA_LAUNCH_BLOCKING"] = "0"
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "introspection": [
        ("caller_frame", '''
        # Reads the harness's locals (expected outputs) from the calling frame.
        import sys
        class ModelNew(nn.Module):
            def forward(self, x, y):
                ref = sys._getframe(1).f_locals.get("expected")
                return _ext.f(x, y)
        '''),
        ("gc_objects", '''
        # Finds the harness's tensors among all live objects.
        import gc
        _all = gc.get_objects()
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("sys_modules", '''
        # Reaches the worker module to switch its checks off.
        import sys
        _worker = sys.modules.get("__main__")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("ctypes", '''
        # Raw memory access from Python.
        import ctypes
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "tensor-subclass": [
        ("tensor_subclass", '''
        # A subclass whose comparisons can be faked.
        class Fake(torch.Tensor):
            pass
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y).as_subclass(Fake)
        '''),
        ("torch_function", '''
        # __torch_function__ intercepts every op the checker runs on the output.
        class Wrapper:
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return True
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("dispatch_mode", '''
        # A dispatch mode rewrites PyTorch calls globally.
        from torch.utils._python_dispatch import TorchDispatchMode
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "file-or-network": [
        ("open_for_write", '''
        # Leaves a file for a later run (or the harness) to find.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                with open("/tmp/out.bin", "wb") as fh:
                    fh.write(b"")
                return _ext.f(x, y)
        '''),
        ("computed_mode", '''
        # The mode is not a literal, so it may write.
        MODE = "r" + "+"
        _fh = open("x.bin", MODE)
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("socket", '''
        # Phones home.
        import socket
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("pathlib_write", '''
        # Writes through pathlib.
        from pathlib import Path
        Path("cache.txt").write_text("1")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("proc_mem", '''
        # Reads process memory through /proc.
        _mem = open("/proc/self/mem", "rb")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("file_io_write", '''
        # io.FileIO is open() under another name: rewrites the task the reference imports.
        import io
        with io.FileIO("../task/model.py", "w") as fh:
            fh.write(b"")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("fd_dup2", '''
        # Diverts an inherited file descriptor (the worker's reply pipe) at the fd level.
        import os
        os.dup2(os.dup(2), 3)
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("sqlite3", '''
        # Rewrites a database on disk (the harness's baseline cache).
        import sqlite3
        sqlite3.connect("baselines.sqlite").execute("UPDATE baselines SET stats = ''")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("log_file", '''
        # A logging handler that writes a file.
        import logging
        logging.getLogger().addHandler(logging.FileHandler("/tmp/answers.log"))
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("archive_write", '''
        # Archives opened for writing are files opened for writing.
        import tarfile
        import zipfile
        zipfile.ZipFile("out.zip", "a")
        tarfile.open("out.tar.gz", "w:gz")
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "stream-creation": [
        ("side_stream", '''
        # The kernel runs on a side stream the timer does not wait for.
        class ModelNew(nn.Module):
            def forward(self, x, y):
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    return _ext.f(x, y)
        '''),
        ("cuda_graph", '''
        # A captured graph replays on its own stream.
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.graph = torch.cuda.CUDAGraph()
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
    "unverifiable-source": [
        ("source_from_file", '''
        # The CUDA source comes from a file the guards do not scan.
        with open("kernel.cu") as fh:
            _src = fh.read()
        _ext2 = load_inline(name="k2", cpp_sources="", cuda_sources=_src)
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("third_party_import", '''
        # Triton kernels are not the candidate's CUDA extension.
        import triton
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("force_include_flag", '''
        # -include pulls a header the guards never read into every translation unit.
        _ext3 = load_inline(name="k3", cpp_sources="", extra_cflags=["-include", "/tmp/evil.h"])
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
        ("cuda_extension_without_kernels", '''
        # A single-file solution has no kernels/ to build cuda_extension from: whatever is found runs.
        import cuda_extension
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return cuda_extension.f(x, y)
        '''),
        ("augmented_source", '''
        # The source is grown after its first assignment; only the first piece would be read.
        SRC = "torch::Tensor g(torch::Tensor x) { return x; }"
        SRC += " // more"
        _ext4 = load_inline(name="k4", cpp_sources=SRC)
        class ModelNew(nn.Module):
            def forward(self, x, y):
                return _ext.f(x, y)
        '''),
    ],
}

NEAR_MISSES = [
    ("shape_arithmetic", '''
    # Integer arithmetic on shapes and constants is launch configuration, not compute.
    BLOCK = 256
    class ModelNew(nn.Module):
        def forward(self, x, y):
            n = x.shape[0] * 2
            blocks = (x.numel() + BLOCK - 1) // BLOCK
            rows = x.size(0) * x.size(1) if x.dim() > 1 else max(x.size(0), 1)
            return _ext.f(x, y)
    '''),
    ("allocation_and_views", '''
    # Allocating the output and reshaping inputs are allowed.
    class ModelNew(nn.Module):
        def forward(self, x, y):
            out = torch.empty_like(x)
            flat = x.contiguous().view(-1)
            z = torch.zeros(x.shape[0], 4, device=x.device, dtype=x.dtype)
            return _ext.f(flat, y.reshape(-1)).view(x.shape)
    '''),
    ("layer_as_parameter_container", '''
    # Holding nn.Linear for its parameters (and the state-dict names) is fine; only calling it is not.
    class ModelNew(nn.Module):
        def __init__(self, d: int, eps: float = 1e-5):
            super().__init__()
            self.fc = nn.Linear(d, d)
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        @torch.no_grad()
        def forward(self, x, y, dim: int = 1):
            w = self.fc.weight.contiguous()
            scale = float(self.eps) * 2 + int(dim)
            torch.cuda.synchronize()
            return _ext.f(x, w)
    '''),
    ("helpers_and_autograd_function", '''
    # Helpers and an autograd.Function that only call the extension.
    def _launch(x, y):
        return _ext.f(x.contiguous(), y.contiguous())
    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return _launch(x, y)
    class ModelNew(nn.Module):
        def forward(self, x, y):
            assert x.is_cuda and x.dtype == torch.float32, "needs fp32 CUDA input"
            outs = [_Fn.apply(x[i], y[i]) for i in range(x.shape[0])]
            return outs[0]
    '''),
    ("harmless_module_code", '''
    # Reading files, os.path, module-level try/except, sys.version, inspect.signature, self.eval():
    # none of it changes what forward computes or touches the harness.
    import inspect
    import os
    import sys
    try:
        import numpy as np
    except ImportError:
        np = None
    HERE = os.path.dirname(os.path.abspath(__file__))
    with open(__file__) as fh:
        _text = fh.read()
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    PY = sys.version_info
    SIG = inspect.signature(len)
    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.eval()
            setattr(self, "scale", nn.Parameter(torch.ones(1)))
        def forward(self, x, y):
            try:
                n = x.numel()
            finally:
                pass
            return _ext.f(x, y)
    '''),
    ("formatted_source", '''
    # Sources built from literals with %, str.format and replace are read like literals.
    BLOCK = 256
    TEMPLATE = """
    #define BLOCK %d
    __global__ void k(const float* x, float* y, int n) { int i = threadIdx.x %% 32; if (i < n) y[i] = x[i]; }
    torch::Tensor %s(torch::Tensor x, torch::Tensor y) { return torch::empty_like(x); }
    """
    _ext2 = load_inline(name="k2", cpp_sources=TEMPLATE % (BLOCK, "g"),
                        cuda_sources="// {name}".format(name="k").replace("k", "kernel"))
    class ModelNew(nn.Module):
        def forward(self, x, y):
            return _ext2.g(x, y)
    '''),
    ("reading_files_and_logging", '''
    # Reading files (any opener, read mode) and logging to the console write nothing.
    import io
    import logging
    import tarfile
    logging.basicConfig(level=logging.INFO)
    LOG = logging.getLogger(__name__)
    with io.FileIO(__file__) as fh:
        _text = fh.read()
    _archive = tarfile.open("kernels.tar.xz", "r:xz")
    class ModelNew(nn.Module):
        def forward(self, x, y):
            return _ext.f(x, y)
    '''),
    ("current_stream_only", '''
    # The current stream and synchronisation are fine; only new streams are not.
    class ModelNew(nn.Module):
        def forward(self, x, y):
            stream = torch.cuda.current_stream()
            torch.cuda.synchronize()
            return _ext.f(x, y)
    '''),
    ("isinstance_tensor", '''
    # Naming torch.Tensor in a check is not subclassing it.
    class ModelNew(nn.Module):
        def forward(self, x, y):
            if not isinstance(x, torch.Tensor):
                raise TypeError("x must be a tensor")
            return _ext.f(x, y)
    '''),
]


@pytest.mark.parametrize(
    ("code", "source"),
    [pytest.param(code, source, id=f"{code}-{name}") for code, cases in CHEATS.items() for name, source in cases],
)
def test_python_cheat_is_caught(run_guards_on, code: str, source: str) -> None:
    violations = run_guards_on(python=solution(source))
    assert code in {v.code for v in violations}, [f"{v.code}: {v.message}" for v in violations]
    for v in violations:
        assert v.message.startswith("solution.py:"), v.message
        assert "\n" not in v.message


@pytest.mark.parametrize(("name", "source"), NEAR_MISSES, ids=[name for name, _ in NEAR_MISSES])
def test_python_near_miss_is_clean(run_guards_on, name: str, source: str) -> None:
    violations = run_guards_on(python=solution(source))
    assert violations == [], [f"{v.code}: {v.message}" for v in violations]


def test_every_python_code_has_two_cheats() -> None:
    assert all(len(cases) >= 2 for cases in CHEATS.values())


def test_torch_compute_message_names_the_op_and_the_line(run_guards_on) -> None:
    [violation] = run_guards_on(python=solution(CHEATS["torch-compute-fallback"][0][1]))
    assert violation.code == "torch-compute-fallback"
    assert violation.message.startswith("solution.py:12: ModelNew.forward: calls torch.matmul")
    assert "CUDA extension" in violation.message


def test_forward_arguments_count_as_tensors_whatever_their_annotation(run_guards_on) -> None:
    # An annotation or a default is the candidate's word, not the harness's: x: int can be a tensor.
    body = '''
    class ModelNew(nn.Module):
        def forward(self, x: int, y=0, k: int = 2):
            return _ext.f(x, y).view({expr}, -1)
    '''
    violations = run_guards_on(python=solution(body.format(expr="k * 2 + x * y")))
    assert {v.code for v in violations} == {"torch-compute-fallback"}
    assert run_guards_on(python=solution(body.format(expr="int(k) * 2"))) == []


def test_extra_allowed_torch_calls_allow_a_function_and_a_method(run_guards_on) -> None:
    source = solution('''
    class ModelNew(nn.Module):
        def forward(self, x, y):
            return torch.cat([_ext.f(x, y), y]).clamp_(0)
    ''')
    assert {v.code for v in run_guards_on(python=source)} == {"torch-compute-fallback"}
    config = GuardConfig(extra_allowed_torch_calls=("torch.cat", "Tensor.clamp_"))
    assert run_guards_on(python=source, config=config) == []


def test_allow_streams_permits_side_streams(run_guards_on) -> None:
    source = solution(CHEATS["stream-creation"][0][1])
    assert "stream-creation" in {v.code for v in run_guards_on(python=source)}
    assert run_guards_on(python=source, config=GuardConfig(allow_streams=True)) == []


def test_custom_op_namespace_from_torch_library_is_the_extension(run_guards_on) -> None:
    source = '''
    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    SRC = """
    #include <torch/extension.h>
    torch::Tensor twice(torch::Tensor x) { return x; }
    TORCH_LIBRARY(mykernels, m) { m.def("twice", &twice); }
    """
    load_inline(name="k", cpp_sources=SRC, is_python_module=False)

    class ModelNew(nn.Module):
        def forward(self, x):
            return torch.ops.mykernels.twice(x)
    '''
    assert run_guards_on(python=source) == []
    assert {v.code for v in run_guards_on(python=source.replace("torch.ops.mykernels", "torch.ops.aten"))} == {
        "torch-compute-fallback"}


def test_formatted_source_is_scanned(run_guards_on) -> None:
    source = solution('''
    TEMPLATE = "torch::Tensor g(torch::Tensor x) { return %s; }"
    _ext2 = load_inline(name="k2", cpp_sources=TEMPLATE % "at::relu(x)")
    class ModelNew(nn.Module):
        def forward(self, x, y):
            return _ext2.g(x)
    ''')
    assert {v.code for v in run_guards_on(python=source)} == {"aten-compute-fallback"}


def test_file_shadowing_the_extension_is_unverifiable(run_guards_on) -> None:
    violations = run_guards_on(files={"cuda_extension.py": "f = lambda x, y: x\n"}, kernel="""
    torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
    """)
    assert [(v.code, v.message.split(":")[0]) for v in violations] == [("unverifiable-source", "cuda_extension.py")]

"""The fast workdir contract: launchers over the harness's header, the shim as the tensor glue.

The built module is driven in this process the way model_new.py drives it (arguments of every
kind, outputs made by the shim, errors); the builds compile no torch header (a couple of seconds
each) once the shim exists (built once per cache, like the precompiled header).
"""

from __future__ import annotations

import importlib.util
import secrets
import subprocess
from pathlib import Path

import pytest
import torch

from cuda_agent.environment import BuildConfig, load_solution
from cuda_agent.environment.build import CompileError, build_solution
from cuda_agent.environment.launchers import exported_launchers, launcher_table_source
from cuda_agent.environment.solution import EXTENSION_NAME, Layout

HEADER = "#include <cuda_agent_launcher.h>\n"
LAUNCHERS = r"""
#include <cuda_agent_launcher.h>
#include <cstdint>

// out = a * x + b, from a tensor, a float and an int; a second output counts the bools passed.
extern "C" int affine(cuda_agent_call* call) {
    if (cuda_agent_expect_args(call, 4) || cuda_agent_expect_tensor(call, 0, CUDA_AGENT_FLOAT64)) return 1;
    const cuda_agent_arg& x = call->args[0];
    if (call->args[1].kind != CUDA_AGENT_FLOAT || call->args[2].kind != CUDA_AGENT_INT ||
        call->args[3].kind != CUDA_AGENT_INT) {
        return cuda_agent_fail(call, "expected (tensor, float, int, bool)");
    }
    double* out = nullptr;
    int64_t* flag = nullptr;
    const int64_t one[1] = {1};
    if (cuda_agent_output(call, CUDA_AGENT_FLOAT64, x.ndim, x.sizes, (void**)&out) ||
        cuda_agent_output(call, CUDA_AGENT_INT64, 1, one, (void**)&flag)) return 1;
    for (int64_t i = 0; i < x.numel; ++i) out[i] = call->args[1].f * ((const double*)x.data)[i] + call->args[2].i;
    flag[0] = call->args[3].i;
    return 0;
}

// Writes into the tensor it is passed; returns nothing.
extern "C" int fill_seven(cuda_agent_call* call) {
    if (cuda_agent_expect_args(call, 1) || cuda_agent_expect_tensor(call, 0, CUDA_AGENT_INT32)) return 1;
    for (int64_t i = 0; i < call->args[0].numel; ++i) ((int32_t*)call->args[0].data)[i] = 7;
    return 0;
}

extern "C" int refuse(cuda_agent_call* call) { return cuda_agent_fail(call, "refused with code %d", 42); }

static int not_exported(int v) { return v; }
int cxx_helper(int v) { return not_exported(v); }
"""


def _workdir(root: Path, sources: dict[str, str], model: str = "import cuda_extension\n") -> Path:
    (root / "kernels").mkdir(parents=True)
    tag = f"\n// {secrets.token_hex(8)}\n"  # a cold build even on a cache kept between test runs
    for name, text in sources.items():
        (root / "kernels" / name).write_text(text + tag)
    (root / "model_new.py").write_text(model + "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    pass\n")
    return root


def _import(extensions_dir: Path, name: str):
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, extensions_dir / f"{EXTENSION_NAME}.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_exported_c_functions_are_launchers(tmp_path: Path) -> None:
    source = tmp_path / "k.cpp"
    source.write_text(LAUNCHERS.replace("#include <cuda_agent_launcher.h>", '#include "cuda_agent_launcher.h"'))
    from cuda_agent.environment.launchers import NATIVE_DIR

    subprocess.run(["c++", "-c", f"-I{NATIVE_DIR}", str(source), "-o", str(tmp_path / "k.o")], check=True)
    names = exported_launchers([tmp_path / "k.o"])
    assert names == ["affine", "fill_seven", "refuse"]  # not the static function, not the C++ one
    table = launcher_table_source(names)
    assert '{"refuse", &refuse}' in table and "cuda_agent_launcher_count = 3" in table


def test_kernel_units_that_include_the_launcher_header_mark_the_fast_contract(tmp_path: Path) -> None:
    fast = load_solution(_workdir(tmp_path / "fast", {"k.cpp": LAUNCHERS}))
    assert fast.layout is Layout.WORKDIR and fast.binding_style == "launcher"
    plain = load_solution(_workdir(tmp_path / "plain", {"k.cpp": "int f() { return 1; }\n"}))
    assert plain.layout is Layout.SINGLE_FILE  # no binding, no launcher: model_new.py must build itself


@pytest.fixture(scope="module")
def built_launchers(tmp_path_factory, session_cache_dir: Path):
    """The launchers above, and a workdir copy of the header that would break the build if it
    were compiled (the harness's copy comes first on the include path)."""
    root = _workdir(tmp_path_factory.mktemp("launchers") / "w", {
        "launchers.cpp": LAUNCHERS, "cuda_agent_launcher.h": '#error "the workdir\'s copy of the header"\n'})
    built = build_solution(load_solution(root), "cpu", BuildConfig(), session_cache_dir)
    return built, _import(built.extensions_dir, EXTENSION_NAME)


@pytest.mark.slow  # the shim, once per cache (the session's: shared with the samples)
def test_the_shim_passes_every_argument_kind_and_returns_the_outputs_the_launcher_made(built_launchers) -> None:
    built, module = built_launchers
    stats = built.info.compile_stats
    assert stats["units"] == 2 and stats["pch_units"] == 0 and stats["torch_imported"] == 0, stats
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    out, flag = module.affine(x, 2.5, 3, True)
    assert torch.equal(out, 2.5 * x + 3) and out.shape == (2, 3) and flag.tolist() == [1]
    target = torch.zeros(4, dtype=torch.int32)
    assert module.fill_seven(target) is None and target.tolist() == [7] * 4
    assert not hasattr(module, "cxx_helper")


@pytest.mark.slow
@pytest.mark.parametrize("args, error, message", [
    ((), RuntimeError, "refuse: refused with code 42"),
    ((torch.zeros(2),), RuntimeError, "refuse: refused with code 42"),
    (("text",), TypeError, "refuse: argument 0: a tensor, int, float or bool, not str"),
    ((1 << 70,), OverflowError, "refuse: argument 0: an int beyond the 64-bit range"),
], ids=["no_arguments", "a_tensor", "a_string", "an_int_beyond_64_bits"])
def test_the_shim_reports_what_it_cannot_pass_and_what_the_launcher_refused(built_launchers, args, error,
                                                                             message) -> None:
    _, module = built_launchers
    with pytest.raises(error, match=message):
        module.refuse(*args)


@pytest.mark.slow
def test_the_launchers_own_checks_name_the_argument(built_launchers) -> None:
    _, module = built_launchers
    with pytest.raises(RuntimeError, match="affine: argument 0: expected a contiguous tensor"):
        module.affine(torch.zeros(3, 4, dtype=torch.float64).t(), 1.0, 0, False)
    with pytest.raises(RuntimeError, match="fill_seven: expected 1 arguments, got 2"):
        module.fill_seven(torch.zeros(1, dtype=torch.int32), 1)


_OK_LAUNCHER = 'extern "C" int ok(cuda_agent_call*) { return 0; }\n'


@pytest.mark.slow
@pytest.mark.parametrize("source, expected", [
    (HEADER + "int helper(int v) { return v; }\n", "export no launcher"),
    (HEADER + _OK_LAUNCHER + 'extern "C" int cuda_agent_launcher_count = 0;\n', "link failed"),
    (HEADER + _OK_LAUNCHER + '#include <Python.h>\nextern "C" PyObject* PyInit_cuda_extension() { return nullptr; }\n',
     "link failed"),
], ids=["no_launcher", "own_launcher_table", "own_module_init"])
def test_a_workdir_cannot_stand_in_for_the_table_or_the_module(tmp_path: Path, session_cache_dir: Path,
                                                               source: str, expected: str) -> None:
    root = _workdir(tmp_path / "w", {"k.cpp": source})
    with pytest.raises(CompileError) as raised:
        build_solution(load_solution(root), "cpu", BuildConfig(), session_cache_dir)
    assert expected in raised.value.log_tail, raised.value.log_tail

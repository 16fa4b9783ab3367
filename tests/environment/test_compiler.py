"""The lean compile path: which units may use the precompiled header, nvcc's phase plan, and a
real rebuild that recompiles only the edited unit."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest

from cuda_agent.environment.build import build_solution, toolchain_dir
from cuda_agent.environment.build_sandbox import prepare_toolchain
from cuda_agent.environment.compiler import first_include
from cuda_agent.environment.config import BuildConfig, SandboxConfig
from cuda_agent.environment.nvcc_phases import _plan
from cuda_agent.environment.solution import load_solution

from support import EXAMPLES


@pytest.mark.parametrize(("text", "expected"), [
    ("#include <torch/extension.h>\nint x;", "torch/extension.h"),
    ("// binding\n/* a\n block */\n#pragma once\n\n#include <torch/extension.h>\n", "torch/extension.h"),
    ('  #  include "local.h"\n#include <torch/extension.h>\n', "local.h"),
    ("#define X 1\n#include <torch/extension.h>\n", None),  # a macro before it could change the header
    ("int x;\n#include <torch/extension.h>\n", None),
])
def test_first_include_is_found_only_when_nothing_but_comments_precede_it(text, expected) -> None:
    assert first_include(text) == expected


_DRY_RUN = [
    "_NVVM_BRANCH_=nvvm",
    'SYSTEM_INCLUDES="-isystem" "/usr/local/cuda/include/cccl"',
    'CICC_PATH=/usr/local/cuda/nvvm/bin',
    'gcc -std=c++20 -E -x c++ -D__CUDACC__ a.cu -o "a.cpp4.ii"',
    'cudafe++ --c++20 --gen_module_id_file --module_id_file_name "a.module_id" "a.cpp4.ii"',
    'gcc -std=c++20 -D__CUDA_ARCH__=900 -E -x c++ a.cu -o "a.cpp1.ii"',
    '"$CICC_PATH/cicc" --c++20 -arch compute_90 --module_id_file_name "a.module_id" "a.cpp1.ii" -o "a.ptx"',
    'ptxas -arch=sm_90 -m64 "a.ptx" -o "a.cubin"',
    'fatbinary -64 "--image3=kind=elf,sm=90,file=a.cubin" --embedded-fatbin="a.fatbin.c"',
    'gcc -std=c++20 -c -x c++ -O3 "a.cudafe1.cpp" -o "a.o"',
]


def test_nvcc_plan_splits_host_and_device_chains_and_keeps_nvccs_variables() -> None:
    env, host, device, rest = _plan(_DRY_RUN)
    assert [c.split()[0] for c in host] == ["gcc", "cudafe++"]
    assert [c.split()[0] for c in device] == ["gcc", '"$CICC_PATH/cicc"', "ptxas", "fatbinary"]
    assert rest == [_DRY_RUN[-1]]
    assert env["CICC_PATH"] == "/usr/local/cuda/nvvm/bin" and env["_NVVM_BRANCH_"] == "nvvm"
    assert env["SYSTEM_INCLUDES"] == '"-isystem" "/usr/local/cuda/include/cccl"'


def test_nvcc_plan_refuses_command_lists_it_does_not_know() -> None:
    two_arches = _DRY_RUN[:9] + _DRY_RUN[5:9] + _DRY_RUN[9:]
    assert _plan(two_arches) is None
    assert _plan([line for line in _DRY_RUN if not line.startswith("cudafe++")]) is None


@pytest.mark.slow
def test_rebuild_after_a_kernel_edit_compiles_only_the_edited_unit(tmp_path: Path, session_cache_dir: Path) -> None:
    """Two cold builds of the CPU RMSNorm workdir (the binding contract) that differ in rmsnorm.cpp only: the second takes the
    binding's and the generated module's objects from the cache; units that include
    torch/extension.h first use the precompiled header. The object cache serves unsandboxed builds
    only (as root a build is sandboxed and its objects stay private: test_build_sandbox), so the
    sandbox is off here."""
    stats, run = [], secrets.token_hex(8)  # new sources even on a cache kept between test runs
    # The precompiled header made ahead, as a sandboxed build's preparation makes it (an unsandboxed
    # build would make it itself, importing torch): alone, this test sees what it sees in the suite.
    prepare_toolchain("cpu", BuildConfig(), session_cache_dir, toolchain_dir("cpu", BuildConfig(), session_cache_dir),
                      precompiled_header=True, shim=False)
    for edit in ("first", "second"):
        root = tmp_path / edit
        shutil.copytree(EXAMPLES / "solutions" / "cpu_workdir" / "rmsnorm", root)
        kernel = root / "kernels" / "rmsnorm.cpp"
        kernel.write_text(kernel.read_text() + f"\n// edit {edit} of {run}\n")
        built = build_solution(load_solution(root), "cpu", BuildConfig(), session_cache_dir, SandboxConfig(mode="off"))
        assert not built.info.cached
        stats.append(built.info.compile_stats)
    assert stats[1]["units"] == 3 and stats[1]["object_cache_hits"] == 2, stats
    assert stats[0]["torch_imported"] == stats[1]["torch_imported"] == 0, stats  # torch's flags come prepared
    assert stats[0]["pch_units"] >= 1 and stats[1]["pch_units"] == 1, stats  # rmsnorm.cpp includes torch/extension.h first


def _tiny_workdir(root: Path) -> Path:
    """A workdir whose one unit needs only pybind11 (seconds to compile, not a torch header), new
    sources each time (a cold build even on a cache kept between test runs)."""
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "add_binding.cpp").write_text(
        "#include <pybind11/pybind11.h>\n"
        "void register_add(pybind11::module_& m) { m.def(\"add\", [](int a, int b) { return a + b; }); }\n"
        f"// run {secrets.token_hex(8)}\n")
    (root / "model_new.py").write_text("import torch.nn as nn\nimport cuda_extension\n\n\n"
                                       "class ModelNew(nn.Module):\n    pass\n")
    return root


@pytest.mark.parametrize("lean", [True, False])
def test_both_build_paths_build_a_workdir_module(tmp_path: Path, session_cache_dir: Path, lean: bool) -> None:
    """The lean path, and torch's JIT builder behind ``build.lean = False`` (the fallback). On the
    session's cache: the lean path's precompiled header is the run's (a private cache builds its own)."""
    root = _tiny_workdir(tmp_path / "solution")
    built = build_solution(load_solution(root), "cpu", BuildConfig(lean=lean), session_cache_dir)
    assert (built.extensions_dir / "cuda_extension.so").is_file()
    assert built.info.compile_stats["units"] == (2 if lean else 0)  # its unit and the generated module

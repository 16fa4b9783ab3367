"""Solution layout detection (single file vs agent workdir) and its errors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cuda_agent.environment import SolutionError, load_solution
from cuda_agent.environment.build import build_key
from cuda_agent.environment.config import BuildConfig
from cuda_agent.environment.solution import Layout

from support import EXAMPLES, FIXTURES

MODEL_NEW = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
BINDING = "void register_{name}(pybind11::module_& m) {{}}\n"


def make_workdir(root: Path, kernels: dict[str, str], model_new: str = MODEL_NEW) -> Path:
    root.mkdir()
    (root / "model_new.py").write_text(model_new)
    for name, text in kernels.items():
        path = root / "kernels" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_single_file_solution_is_detected() -> None:
    path = EXAMPLES / "solutions" / "cpu" / "relu.py"
    solution = load_solution(path)
    assert solution.layout is Layout.SINGLE_FILE
    assert solution.root == path.resolve() and solution.model_file == path.resolve()
    assert solution.kernel_files == () and solution.binding_names == ()


def test_workdir_solution_lists_kernels_and_binding_names() -> None:
    path = EXAMPLES / "solutions" / "cpu_workdir" / "rmsnorm"
    solution = load_solution(path)
    assert solution.layout is Layout.WORKDIR
    assert solution.model_file == path.resolve() / "model_new.py"
    assert [p.name for p in solution.kernel_files] == ["rmsnorm.cpp", "rmsnorm_binding.cpp"]
    assert solution.binding_names == ("rmsnorm",)


def test_workdir_finds_nested_kernel_files_and_ignores_other_suffixes(tmp_path: Path) -> None:
    root = make_workdir(tmp_path / "w", {
        "a_binding.cpp": BINDING.format(name="a"),
        "sub/b_binding.cpp": BINDING.format(name="b"),
        "sub/common.cuh": "#pragma once\n",
        "README.md": "notes",
        "build.sh": "echo hi",
    })
    solution = load_solution(root)
    assert solution.layout is Layout.WORKDIR
    assert sorted(p.name for p in solution.kernel_files) == ["a_binding.cpp", "b_binding.cpp", "common.cuh"]
    assert sorted(solution.binding_names) == ["a", "b"]


def test_workdir_without_bindings_is_a_self_contained_single_file(tmp_path: Path) -> None:
    root = make_workdir(tmp_path / "w", {"helper.cpp": "int f() { return 1; }\n"})
    solution = load_solution(root)
    assert solution.layout is Layout.SINGLE_FILE
    assert solution.model_file == root.resolve() / "model_new.py"


def test_cuda_parts_name_cuda_kernels_and_load_calls_and_nothing_in_cpp_solutions(tmp_path: Path) -> None:
    assert load_solution(EXAMPLES / "solutions" / "cuda" / "relu.py").cuda_parts() == ("relu.py:77 cuda_sources",)
    assert load_solution(EXAMPLES / "solutions" / "cuda_workdir" / "relu").cuda_parts() == ("kernels/relu.cu",)
    for cpp in ("cpu/relu.py", "cpu_workdir/relu", "cpu_workdir_binding/relu"):
        assert load_solution(EXAMPLES / "solutions" / cpp).cuda_parts() == (), cpp
    calls = tmp_path / "calls.py"
    calls.write_text(MODEL_NEW + "from torch.utils.cpp_extension import load, load_inline\n"
                     "a = load_inline('a', 'int f();', cuda_sources=[])\n"  # empty: C++ only
                     "b = load_inline('b', 'int g();', 'int g() { return 0; }')\n"  # positional CUDA
                     "c = load(name='c', sources=['c.cpp', 'k.cu'])\n")
    assert load_solution(calls).cuda_parts() == ("calls.py:9 cuda_sources", "calls.py:10 .cu sources")


def test_workdir_binding_name_must_be_an_identifier(tmp_path: Path) -> None:
    root = make_workdir(tmp_path / "w", {"my-relu_binding.cpp": "", "x.cpp": ""})
    with pytest.raises(SolutionError, match=r"binding name 'my-relu' is not a C identifier"):
        load_solution(root)


def test_nonexistent_solution_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SolutionError, match="no such file or directory"):
        load_solution(tmp_path / "missing")


def test_single_file_must_be_python(tmp_path: Path) -> None:
    path = tmp_path / "solution.cu"
    path.write_text("__global__ void k() {}\n")
    with pytest.raises(SolutionError, match=r"must be a \.py file defining ModelNew"):
        load_solution(path)


def test_single_file_without_model_new_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "solution.py"
    path.write_text("import torch.nn as nn\n\nclass Model(nn.Module):\n    pass\n")
    with pytest.raises(SolutionError, match="no top-level 'class ModelNew'"):
        load_solution(path)


def test_model_new_nested_in_a_block_is_not_top_level(tmp_path: Path) -> None:
    path = tmp_path / "solution.py"
    path.write_text("import torch.nn as nn\n\nif True:\n    class ModelNew(nn.Module):\n        pass\n")
    with pytest.raises(SolutionError, match="no top-level 'class ModelNew'"):
        load_solution(path)


def test_single_file_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "solution.py"
    path.write_text("import torch\n\nclass ModelNew(:\n    pass\n")
    with pytest.raises(SolutionError, match=rf"{re.escape(str(path))}: syntax error at line 3"):
        load_solution(path)


def test_workdir_without_model_new_py_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "relu_binding.cpp").write_text("")
    with pytest.raises(SolutionError, match=r"a workdir solution needs model_new\.py"):
        load_solution(root)


def test_workdir_model_new_without_class_is_an_error(tmp_path: Path) -> None:
    root = make_workdir(tmp_path / "w", {"relu_binding.cpp": ""}, model_new="x = 1\n")
    with pytest.raises(SolutionError, match="no top-level 'class ModelNew'"):
        load_solution(root)


def test_workdir_build_key_ignores_model_new_but_not_kernels(tmp_path: Path) -> None:
    """The property the fault tests rely on: copies of one kernels/ folder share one build."""
    config = BuildConfig()
    a = tmp_path / "a"
    b = tmp_path / "b"
    for root, body in ((a, "return x"), (b, "return x + 0")):
        shutil.copytree(FIXTURES / "fault_kernels" / "kernels", root / "kernels")
        (root / "model_new.py").write_text(MODEL_NEW.replace("return x", body))
    key_a = build_key(load_solution(a), "cpu", config)
    assert key_a == build_key(load_solution(b), "cpu", config)
    assert key_a != build_key(load_solution(a), "cuda", config)
    with open(b / "kernels" / "faults.cpp", "a") as f:
        f.write("// edited\n")
    assert key_a != build_key(load_solution(b), "cpu", config)


def test_single_file_build_key_depends_on_its_content(tmp_path: Path) -> None:
    config = BuildConfig()
    path = tmp_path / "solution.py"
    path.write_text(MODEL_NEW)
    first = build_key(load_solution(path), "cpu", config)
    path.write_text(MODEL_NEW + "\n# changed\n")
    assert build_key(load_solution(path), "cpu", config) != first

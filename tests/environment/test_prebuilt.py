"""Single-file candidates load what the protected build compiled, never compile themselves."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cuda_agent.environment import Status
from cuda_agent.environment.prebuilt import _inline_units, call_key, light_prelude_suffices

from build_corpus import CUDA_KERNEL, LAUNCH_ERROR_REPORT, LIGHT_CUDA_KERNEL, LIGHT_GLUE
from support import FIXTURES, SMALL_RELU_TASK


def test_a_load_call_is_the_same_build_wherever_its_files_are(tmp_path: Path) -> None:
    """The build child and the candidate worker import copies of the solution from different folders."""
    keys = []
    for folder in ("build-copy", "candidate-copy"):
        (tmp_path / folder / "include").mkdir(parents=True)
        (tmp_path / folder / "kernel.cpp").write_text("int f() { return 1; }\n")
        keys.append(call_key("load", {"name": "ext", "sources": [str(tmp_path / folder / "kernel.cpp")],
                                      "extra_include_paths": [str(tmp_path / folder / "include")]}))
    assert keys[0] == keys[1]
    (tmp_path / "candidate-copy" / "kernel.cpp").write_text("int f() { return 2; }\n")
    assert call_key("load", {"name": "ext", "sources": [str(tmp_path / "candidate-copy" / "kernel.cpp")],
                             "extra_include_paths": [str(tmp_path / "candidate-copy" / "include")]}) != keys[0]


@pytest.mark.slow  # builds an extension
def test_load_inline_with_other_sources_than_the_build_fails_to_load(run_evaluation, runtime_only_config) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, FIXTURES / "solutions" / "sources_differ_per_import.py",
                             runtime_only_config)
    assert verdict.compiled and verdict.status is Status.RUNTIME_ERROR, verdict.error
    assert "PrebuiltMismatch" in verdict.error and "other sources or flags" in verdict.error


def test_only_cuda_sources_free_of_torch_get_the_light_prelude() -> None:
    assert light_prelude_suffices([LIGHT_CUDA_KERNEL % ""])
    assert not light_prelude_suffices([CUDA_KERNEL])  # torch::Tensor: straight to torch's prelude
    for needs_torch in ("#include <ATen/ATen.h>\n", "#include <torch/extension.h>\n", "at::Half h;",
                        "C10_CUDA_KERNEL_LAUNCH_CHECK();", "c10::cuda::CUDAGuard g(0);"):
        assert not light_prelude_suffices([LIGHT_CUDA_KERNEL % "", needs_torch]), needs_torch
    assert not light_prelude_suffices([])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compiles, runs nothing)")
@pytest.mark.parametrize("report, compiles", [("", True), (LAUNCH_ERROR_REPORT, False)], ids=["light", "needs_cstdio"])
def test_light_prelude_is_cuda_headers_alone(tmp_path: Path, report: str, compiles: bool) -> None:
    """The CUDA unit the light prelude gives compiles with nvcc alone when the source needs nothing
    more; the corpus's retry entry (``fprintf`` without ``<cstdio>``) does not, so the build must
    retry it after torch's prelude (tests/gpu/test_build_differential_cuda.py checks that it does)."""
    units = _inline_units({"cpp_sources": LIGHT_GLUE, "cuda_sources": LIGHT_CUDA_KERNEL % report,
                           "functions": ["relu_forward"]}, tmp_path, light_prelude=True)
    cuda = next(u for u in units if u.is_cuda)
    assert "torch" not in cuda.source.read_text()
    result = subprocess.run(["nvcc", "-c", str(cuda.source), "-o", str(tmp_path / "cuda.o")], capture_output=True,
                            text=True, timeout=120)
    assert (result.returncode == 0) is compiles, result.stderr

"""The static guard entry point: honest examples pass, weird input never crashes, the registry and
the config reject bad names, and every code is documented."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from cuda_agent.environment.guards import (
    STATIC_GUARDS, GuardConfig, GuardConfigError, SourceBundle, StaticGuard, run_guards, run_static_guards,
)
from cuda_agent.environment.guards.base import MAX_SOURCE_BYTES
from cuda_agent.environment.solution import Layout, Solution, load_solution
from cuda_agent.environment.verdict import Violation
from cuda_agent.registry import Registry

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "solutions"
EXAMPLE_SOLUTIONS = sorted(EXAMPLES.glob("*/*.py")) + sorted(p for p in EXAMPLES.glob("*/*") if p.is_dir())
RUNNER_CODES = {"syntax-error", "source-too-large", "unreadable-source", "guard-error"}


@pytest.mark.parametrize("path", EXAMPLE_SOLUTIONS, ids=[str(p.relative_to(EXAMPLES)) for p in EXAMPLE_SOLUTIONS])
def test_honest_example_solution_has_no_violations(path: Path) -> None:
    assert run_static_guards(load_solution(path)) == []


def test_examples_cover_both_layouts() -> None:
    layouts = {load_solution(p).layout for p in EXAMPLE_SOLUTIONS}
    assert layouts == {Layout.SINGLE_FILE, Layout.WORKDIR}
    assert len(EXAMPLE_SOLUTIONS) >= 16


def _single_file(tmp_path: Path, data: bytes) -> Solution:
    """A solution object for bytes that ``load_solution`` itself would reject (it parses first)."""
    path = tmp_path / "solution.py"
    path.write_bytes(data)
    return Solution(Layout.SINGLE_FILE, path, path)


def test_file_that_does_not_parse_is_a_syntax_error(tmp_path: Path) -> None:
    violations = run_static_guards(_single_file(tmp_path, b"class ModelNew(nn.Module):\n    def forward(self, x:\n"))
    assert [v.code for v in violations] == ["syntax-error"]
    assert violations[0].message.startswith("solution.py:")


def test_binary_input_does_not_crash(tmp_path: Path) -> None:
    data = bytes(range(256)) * 64 + b"\x00class ModelNew: pass\n"
    assert [v.code for v in run_static_guards(_single_file(tmp_path, data))] == ["syntax-error"]
    workdir = tmp_path / "work"
    (workdir / "kernels").mkdir(parents=True)
    (workdir / "model_new.py").write_text("import cuda_extension\nclass ModelNew:\n    pass\n")
    (workdir / "kernels" / "k_binding.cpp").write_bytes(bytes(range(256)) * 64)
    (workdir / "kernels" / "k.cu").write_bytes(b"\xff\xfe\x00R\"(unterminated /* \\\n'")
    violations = run_static_guards(load_solution(workdir))
    assert all(isinstance(v, Violation) and v.code != "guard-error" for v in violations)


def test_huge_file_is_source_too_large(tmp_path: Path) -> None:
    data = b"class ModelNew:\n    pass\n" + b"# padding\n" * (MAX_SOURCE_BYTES // 10 + 1)
    assert [v.code for v in run_static_guards(_single_file(tmp_path, data))] == ["source-too-large"]


def test_large_sources_are_scanned_quickly() -> None:
    kernel = "__global__ void k(float* o) { o[threadIdx.x] = 1.f; }\n" * 8000  # ~450 KB
    python = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n" + \
        "".join(f"C{i} = {i} * 2 + 1\n" for i in range(20000))
    started = time.monotonic()
    violations = run_guards(SourceBundle({"m.py": python}, {"kernels/k.cu": kernel}), GuardConfig())
    assert violations == []
    assert time.monotonic() - started < 30


def test_deep_nesting_fails_closed_without_raising() -> None:
    python = ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return "
              + "x + " * 3000 + "x\n")
    violations = run_guards(SourceBundle({"m.py": python}), GuardConfig())
    assert violations and {v.code for v in violations} <= {"torch-compute-fallback", "guard-error", "syntax-error"}


class _ExplodingGuard(StaticGuard):
    name = "exploding"

    def check(self, bundle: SourceBundle, config: GuardConfig) -> list[Violation]:
        raise RuntimeError("boom")


def test_a_guard_that_raises_becomes_a_guard_error() -> None:
    registry: Registry[StaticGuard] = Registry("static guard")
    registry.register("exploding", _ExplodingGuard())
    [violation] = run_guards(SourceBundle({"m.py": "x = 1\n"}), GuardConfig(), registry)
    assert violation.code == "guard-error"
    assert "exploding" in violation.message and "boom" in violation.message


def test_unknown_guard_name_lists_the_valid_names() -> None:
    with pytest.raises(KeyError) as excinfo:
        STATIC_GUARDS.get("no-such-guard")
    message = str(excinfo.value)
    assert "no-such-guard" in message
    assert all(name in message for name in STATIC_GUARDS.names())


def test_duplicate_guard_name_is_an_error() -> None:
    registry: Registry[StaticGuard] = Registry("static guard")
    registry.register("exploding", _ExplodingGuard())
    with pytest.raises(ValueError, match="duplicate"):
        registry.register("exploding", _ExplodingGuard())


def test_disabled_config_reports_nothing(tmp_path: Path) -> None:
    solution = _single_file(tmp_path, b"import threading\nclass ModelNew: pass\n")
    assert run_static_guards(solution, GuardConfig(enabled=False)) == []
    assert [v.code for v in run_static_guards(solution)] == ["concurrency"]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"allowed_libraries": ("cublas", "mkl")}, "valid: cublas"),
        ({"allowed_libraries": ["cublas"]}, "tuple of strings"),
        ({"extra_allowed_torch_calls": ("cat",)}, "'torch.<path>'"),
        ({"allow_streams": "yes"}, "must be a bool"),
    ],
)
def test_invalid_config_is_rejected_with_the_fix(kwargs: dict, fragment: str) -> None:
    with pytest.raises(GuardConfigError, match=re.escape(fragment)):
        GuardConfig(**kwargs)


def test_every_code_is_documented() -> None:
    doc = (REPO / "docs" / "guards.md").read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", doc, flags=re.MULTILINE))
    assert documented == set(STATIC_GUARDS.names()) | RUNNER_CODES

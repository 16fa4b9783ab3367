"""The degenerate-task detector flags tasks whose reference cannot tell right kernels from wrong ones."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.environment import load_task
from cuda_agent.environment.degenerate import detect_degenerate

from support import EXAMPLES

_HEADER = "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x, y):\n        return {body}\n\n"
_INPUTS = "def get_inputs():\n    return [torch.randn(32, 32), torch.randn(32, 32)]\n\ndef get_init_inputs():\n    return []\n"


def _task(tmp_path: Path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(_HEADER.format(body=body) + _INPUTS)
    return load_task(path)


def test_near_zero_output_is_tiny_and_seed_insensitive(tmp_path: Path) -> None:
    report = detect_degenerate(_task(tmp_path, "tiny", "(x - x) * 1e-9 + y * 1e-6"))
    assert {"tiny-output", "seed-insensitive"} <= set(report.flags)
    assert report.degenerate and report.error is None


def test_an_input_the_output_ignores_is_flagged(tmp_path: Path) -> None:
    report = detect_degenerate(_task(tmp_path, "ignores", "torch.relu(x) + 0 * y"))
    assert report.flags == ["input-ignored"]
    assert "input 1" in report.details[0]


def test_a_forward_pass_that_writes_into_an_input_is_flagged(tmp_path: Path) -> None:
    report = detect_degenerate(_task(tmp_path, "writes", "x + y.mul_(2.0)"))
    assert report.flags == ["input-mutated"]
    assert "writes into input 1" in report.details[0]
    nan_input = _task(tmp_path, "nan_input", "x + torch.nan_to_num(y)").code.replace(
        "torch.randn(32, 32)]", "torch.randn(32, 32).masked_fill(torch.rand(32, 32) < 0.1, float('nan'))]")
    path = tmp_path / "nan_input.py"
    path.write_text(nan_input)
    assert "input-mutated" not in detect_degenerate(load_task(path)).flags  # NaN left as NaN is unchanged


def test_an_output_that_is_a_view_of_an_input_is_flagged(tmp_path: Path) -> None:
    report = detect_degenerate(_task(tmp_path, "returns_view", "(x * 2.0, torch.unbind(y)[0])"))
    assert report.flags == ["output-aliases-input"]
    assert "output 1 is a view of an input" in report.details[0]
    assert "output-aliases-input" not in detect_degenerate(_task(tmp_path, "fresh", "torch.unbind(y)[0] + x")).flags


def test_constant_output_is_flagged(tmp_path: Path) -> None:
    report = detect_degenerate(_task(tmp_path, "constant", "torch.full_like(x, 3.0) + 0 * (x + y)"))
    assert "constant-output" in report.flags


def test_sample_tasks_are_not_degenerate() -> None:
    for name in ("softmax", "rmsnorm", "add_relu_mul"):
        report = detect_degenerate(load_task(EXAMPLES / "tasks" / f"{name}.py"))
        assert report.flags == [] and not report.degenerate, (name, report)


def test_a_reference_that_fails_is_reported_as_an_error(tmp_path: Path) -> None:
    report = detect_degenerate(_task(tmp_path, "broken", "x @ torch.randn(3, 3)"))
    assert report.error is not None and "reference failed" in report.error
    assert report.degenerate

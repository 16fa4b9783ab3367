"""Helpers for the static guard tests: write a candidate to a temporary directory, load it with
``load_solution`` (as the evaluator does) and run the static guards. Fast: nothing is compiled."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from cuda_agent.environment.guards import GuardConfig, run_static_guards
from cuda_agent.environment.solution import load_solution
from cuda_agent.environment.verdict import Violation

# An honest workdir model: the cheats of a C++ test live in kernels/k.cu only.
WORKDIR_MODEL = '''
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cuda_extension.f(x.contiguous(), y.contiguous())
'''
BINDING = '''
#include <torch/extension.h>

torch::Tensor f(torch::Tensor x, torch::Tensor y);

void register_k(pybind11::module_& m) {
    m.def("f", &f, "the kernel under test");
}
'''

GuardRun = Callable[..., list[Violation]]


@pytest.fixture
def run_guards_on(tmp_path: Path) -> GuardRun:
    """``run_guards_on(python=..., kernel=..., files={...}, config=...)`` -> violations.

    Without ``kernel``/``files`` the Python source is a single-file solution; with them it is a
    workdir (``model_new.py`` defaults to an honest model calling ``cuda_extension.f``)."""
    counter = itertools.count()

    def run(python: str | None = None, kernel: str | None = None, files: dict[str, str] | None = None,
            config: GuardConfig | None = None) -> list[Violation]:
        root = tmp_path / f"case{next(counter)}"
        root.mkdir()
        if kernel is None and files is None:
            path = root / "solution.py"
            path.write_text(textwrap.dedent(python or ""))
        else:
            path = root
            (root / "model_new.py").write_text(textwrap.dedent(python or WORKDIR_MODEL))
            (root / "kernels").mkdir()
            (root / "kernels" / "k_binding.cpp").write_text(BINDING)
            (root / "kernels" / "k.cu").write_text(textwrap.dedent(kernel or ""))
            for name, text in (files or {}).items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(textwrap.dedent(text))
        return run_static_guards(load_solution(path), config or GuardConfig())

    return run

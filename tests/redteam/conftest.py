"""Fixtures for the red-team suite (tests/redteam): cheating solutions the environment must reject.

Cost model (2-core CI): every native cheat and honest control lives in ONE kernels folder
(``fixtures/exploit_kernels/kernels``: pybind11 only, no torch header), copied into a fresh workdir
per test with that test's ``model_new.py``. The build key depends only on ``kernels/``, so the whole
suite compiles once (shared session cache, see tests/conftest.py). Python-level cheats use the same
workdir layout, so they need no build of their own either. Single-file C++ cheats that the static
guards reject are never compiled.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from cuda_agent.environment import EvalConfig, VerifyConfig
from cuda_agent.environment.guards import GuardConfig

from redteam_support import REDTEAM_TIMING, SHARED_KERNELS, uses_load_inline

@pytest.fixture()
def redteam_config(make_config) -> Callable[..., EvalConfig]:
    """``redteam_config(guards=True, precision="faithful")``: CPU config on the shared cache."""

    def make(guards: bool = True, precision: str = "faithful") -> EvalConfig:
        return make_config(timing=REDTEAM_TIMING, verify=VerifyConfig(precision=precision),
                           guards=GuardConfig(enabled=guards))

    return make


@pytest.fixture()
def solution_dir(tmp_path: Path) -> Callable[[Path], Path]:
    """``solution_dir(fixture)``: the candidate to evaluate for a fixture file or folder.

    A ``.py`` file becomes ``model_new.py`` of a fresh workdir holding the shared kernels; a folder
    is copied whole (extra helper files included) and gets the shared kernels too. Single-file
    ``load_inline`` fixtures are returned as they are.
    """

    def make(fixture: Path) -> Path:
        if uses_load_inline(fixture):
            return fixture
        root = Path(tempfile.mkdtemp(prefix=f"redteam_{fixture.stem}_", dir=tmp_path))
        if fixture.is_dir():
            shutil.copytree(fixture, root, dirs_exist_ok=True)
        else:
            shutil.copy(fixture, root / "model_new.py")
        shutil.copytree(SHARED_KERNELS, root / "kernels")
        return root

    return make

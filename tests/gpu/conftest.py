"""Fixtures for the CUDA tests (skipped without a GPU by the root conftest's ``gpu`` marker hook)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from cuda_agent.environment import BuildConfig, EvalConfig

from support import FAST_TIMING


@pytest.fixture()
def make_cuda_config(session_cache_dir: Path, scratch_dir: Path) -> Callable[..., EvalConfig]:
    """``make_cuda_config(**changes)``: a CUDA ``EvalConfig`` built for this GPU, on the shared cache."""

    def make(**changes) -> EvalConfig:
        arch = ".".join(map(str, torch.cuda.get_device_capability()))
        base = EvalConfig(device="cuda", cache_dir=session_cache_dir, scratch_dir=scratch_dir, timing=FAST_TIMING,
                          build=BuildConfig(cuda_arch=arch))
        return base.replace(**changes)

    return make

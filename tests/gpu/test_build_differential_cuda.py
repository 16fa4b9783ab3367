"""The differential build test (tests/environment/test_build_differential.py) on CUDA: the lean
path and torch's builder give the same verdict on every selected corpus entry
(``CUDA_AGENT_BUILD_CORPUS=all`` for all 34, among them the light CUDA prelude and its retry
with torch's prelude, whose prelude the build's manifest must show)."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.environment import BuildConfig, EvalConfig

from build_corpus import Style, assert_same_verdict, run_differential, selected_styles
from support import FAST_TIMING

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def cuda_corpus(tmp_path_factory, session_cache_dir) -> dict:
    arch = ".".join(map(str, torch.cuda.get_device_capability()))
    base = EvalConfig(device="cuda", cache_dir=session_cache_dir, timing=FAST_TIMING, build=BuildConfig(cuda_arch=arch))
    return run_differential(base, tmp_path_factory.mktemp("corpus-cuda"))


@pytest.mark.parametrize("style", selected_styles("cuda"), ids=lambda s: s.name)
def test_lean_and_torch_builders_give_the_same_verdict_on_cuda(style: Style, cuda_corpus) -> None:
    assert_same_verdict(style, cuda_corpus[style.name])

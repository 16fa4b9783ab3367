"""Paths and settings shared by the red-team conftest and test module (imported as
``redteam_support``: a unique name, unlike ``conftest``)."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.environment import TimingConfig

REDTEAM = Path(__file__).resolve().parent
FIXTURES = REDTEAM / "fixtures"
TASKS = FIXTURES / "tasks"
EXPLOITS = FIXTURES / "exploits"
HONEST = FIXTURES / "honest"
CUDA_EXPLOITS = REDTEAM / "cuda"
SHARED_KERNELS = FIXTURES / "exploit_kernels" / "kernels"

# Like tests/support.FAST_TIMING (the suite checks verdicts, not timing precision), with a shorter
# warm-up: the timing loop still makes dozens of back-to-back calls, which several cheats rely on.
REDTEAM_TIMING = TimingConfig(budget_s=0.2, min_samples=3, warmup_calls=2, warmup_ms=20, compile_baseline=False)


def uses_load_inline(path: Path) -> bool:
    """Single-file C++ fixtures (``load_inline``) are evaluated as they are, never as workdirs."""
    return path.is_file() and "load_inline(" in path.read_text()

"""An evaluation on a shared GPU holds it for its device work only, waits while another holds it,
and says how long it waited (environment/device_share.py)."""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuda_agent.environment import Status, evaluate, load_task
from cuda_agent.environment.device_share import DeviceShare

from support import SMALL_RELU_TASK, child_pids

HELD_S = 6.0


def _task_and_selfcheck(folder: Path) -> tuple[Path, Path]:
    """A task new to the baseline cache (its baselines are timed) and its own reference as the
    candidate, as ``tasks check`` judges it."""
    task = folder / "small_relu.py"
    task.write_text(SMALL_RELU_TASK.read_text() + f"\n# {secrets.token_hex(8)}\n")
    solution = folder / "selfcheck.py"
    solution.write_text(task.read_text() + "\n\nclass ModelNew(Model):\n    pass\n")
    return task, solution


def test_a_shared_device_is_held_for_device_work_and_waited_for(plain_torch_config, scratch_dir, tmp_path) -> None:
    gpu = threading.Lock()
    asked: list[float] = []

    @contextlib.contextmanager
    def hold():
        asked.append(time.monotonic())
        with gpu:
            yield

    share = DeviceShare(hold, evaluations=2)
    gpu.acquire()  # another evaluation's device work, for HELD_S
    released_at = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        started = time.monotonic()
        task, solution = _task_and_selfcheck(tmp_path)
        future = pool.submit(evaluate, load_task(task), solution, plain_torch_config, share=share)
        time.sleep(HELD_S)
        assert not future.done(), "the evaluation finished while the device it shares was held"
        released_at = time.monotonic()
        gpu.release()
        verdict = future.result(timeout=300)
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.baseline_sources == {"eager_tf32_off": "timed"}
    assert asked and asked[0] < released_at  # it reached its device work and waited there
    waited = float(re.fullmatch(r"2 evaluations at once; ([\d.]+) s waiting for the GPU",
                                verdict.environment["device_shared"]).group(1))
    assert waited >= released_at - asked[0] - 0.5
    assert verdict.phase_seconds["total"] >= released_at - started - 0.5
    # prepare, baselines, the candidate's phases and teardown, each held on its own
    assert len(asked) == 4
    assert child_pids() == [] and list(scratch_dir.iterdir()) == []


def test_a_device_share_is_at_least_two_evaluations_each_planning_its_part() -> None:
    share = DeviceShare(contextlib.nullcontext, evaluations=3)
    assert share.memory_share(141 * 2**30) == 47 * 2**30
    with pytest.raises(ValueError, match=">= 2 evaluations, got 1"):
        DeviceShare(contextlib.nullcontext, evaluations=1)

"""An evaluation on a shared GPU holds it alone for its measurements and beside other evaluations
for the rest of its device work, and says how long it waited (environment/device_share.py)."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuda_agent.environment import Status, evaluate, load_task
from cuda_agent.environment.device_share import DeviceShare, conv_workspace_cap_mb
from cuda_agent.synth import device_lock

from support import SMALL_RELU_TASK, child_pids

BLOCKED_S = 1.0  # long enough for a measurement that is not blocked to enter its hold


def _task_and_selfcheck(folder: Path) -> tuple[Path, Path]:
    """A task new to the baseline cache (its baselines are timed) and its own reference as the
    candidate, as ``tasks check`` judges it."""
    task = folder / "small_relu.py"
    task.write_text(SMALL_RELU_TASK.read_text() + f"\n# {secrets.token_hex(8)}\n")
    solution = folder / "selfcheck.py"
    solution.write_text(task.read_text() + "\n\nclass ModelNew(Model):\n    pass\n")
    return task, solution


def test_a_shared_device_is_held_alone_to_measure_and_beside_others_for_the_rest(plain_torch_config, scratch_dir,
                                                                                tmp_path) -> None:
    """With another evaluation's untimed device work under way (a real lock of its own), this one
    loads its problem beside it and waits to measure until it ends."""
    device = f"test-{secrets.token_hex(4)}"
    holds: list[tuple[str, float, float]] = []  # (kind, asked at, entered at)
    measure_asked = threading.Event()

    def recorded(kind: str, hold):
        @contextlib.contextmanager
        def entered():
            asked = time.monotonic()
            if kind == "measure":
                measure_asked.set()
            with hold(device):
                holds.append((kind, asked, time.monotonic()))
                yield
        return entered

    share = DeviceShare(measure=recorded("measure", device_lock.measuring), use=recorded("use", device_lock.using),
                        evaluations=2)
    other_started, other_release = threading.Event(), threading.Event()

    def other_evaluation() -> None:
        with device_lock.using(device):
            other_started.set()
            other_release.wait(300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        other = pool.submit(other_evaluation)
        assert other_started.wait(5)
        started = time.monotonic()
        task, solution = _task_and_selfcheck(tmp_path)
        future = pool.submit(evaluate, load_task(task), solution, plain_torch_config, share=share)
        assert measure_asked.wait(240), "the evaluation never asked to measure"
        time.sleep(BLOCKED_S)  # however slow the host, the request is made before the release
        assert not future.done(), "the evaluation measured while another's device work ran"
        assert [kind for kind, _, _ in holds] == ["use"], "the evaluation measured while another's device work ran"
        released_at = time.monotonic()
        other_release.set()
        other.result()
        verdict = future.result(timeout=300)
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.baseline_sources == {"eager_tf32_off": "timed"}
    # prepare, baselines, load and verify, the candidate's timing, the check after it with teardown
    assert [kind for kind, _, _ in holds] == ["use", "measure", "use", "measure", "use"]
    assert holds[0][2] < released_at  # it loaded its problem beside the other's work ...
    assert holds[1][1] < released_at <= holds[1][2]  # ... and measured only after it
    assert verdict.environment["device_shared"] == "2 evaluations at once"
    waited = verdict.device_seconds["wait"]
    assert waited == pytest.approx(sum(entered - asked for _, asked, entered in holds), abs=0.05)
    assert waited >= released_at - holds[1][1]
    assert verdict.device_seconds["measure"] > 0 and verdict.device_seconds["use"] > 0
    turns = verdict.device_turns  # the same turns, each with the phase it served
    assert [(turn["phase"], turn["mode"]) for turn in turns] == [
        ("prepare", "use"), ("baselines", "measure"), ("load", "use"), ("profile", "measure"), ("post_timing", "use")]
    assert [turn["wait_s"] for turn in turns] == pytest.approx([entered - asked for _, asked, entered in holds], abs=0.05)
    assert sum(turn["held_s"] for turn in turns if turn["mode"] == "measure") == verdict.device_seconds["measure"]
    assert verdict.phase_seconds["total"] >= released_at - started - 0.5
    assert child_pids() == [] and list(scratch_dir.iterdir()) == []


def test_a_device_share_is_at_least_two_evaluations_each_planning_its_part() -> None:
    share = DeviceShare(contextlib.nullcontext, contextlib.nullcontext, evaluations=3)
    assert share.memory_share(141 * 2**30) == 47 * 2**30
    assert conv_workspace_cap_mb(141 * 2**30, 3) == 47 * 1024 // 2  # cuDNN's workspace: half the share
    with pytest.raises(ValueError, match=">= 2 evaluations, got 1"):
        DeviceShare(contextlib.nullcontext, contextlib.nullcontext, evaluations=1)

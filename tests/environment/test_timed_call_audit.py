"""The audit of timed calls (candidate_worker.TimedCallAudit): a uniform sample, captured into
shared buffers allocated once, outside torch's allocator, so the allocator does not reveal which
calls were audited, and none beyond the kept calls' (a GPU-sized output costs no spare copy); and
a thread a timed call left running when its batch's timer stopped, however soon it ended."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import torch

from cuda_agent.environment.candidate_worker import SpareShares, TimedCallAudit
from cuda_agent.environment.shared_tensors import open_share
from cuda_agent.environment.thread_starts import ThreadStartLog
from cuda_agent.environment.timing import CpuTimer


@pytest.fixture()
def audit_folder(tmp_path: Path) -> Path:
    return tmp_path


def _audit(size: int, seed: int, threads: ThreadStartLog | None = None, timer: CpuTimer | None = None,
           folder: Path | None = None) -> TimedCallAudit:
    import tempfile

    spares = SpareShares("cpu", folder or Path(tempfile.mkdtemp()), "events")
    return TimedCallAudit(size, random.Random(seed), threads or ThreadStartLog(), timer or CpuTimer(), spares)


def _run(audit: TimedCallAudit, outputs: list) -> None:
    for out in outputs:
        audit(audit.seen + 1, out)


def _buffers(audit: TimedCallAudit) -> set[int]:
    return {id(share) for _, share in audit.kept} | {id(share) for share in audit._spares or []}


def test_every_call_is_audited_with_the_same_probability(audit_folder: Path) -> None:
    counts = [0] * 10
    for seed in range(600):
        audit = _audit(3, seed, folder=audit_folder)
        _run(audit, [torch.full((2,), float(i)) for i in range(10)])
        for call, _ in audit.finish():
            counts[call - 1] += 1
        for _, kept in audit.kept:
            kept.release()
    assert all(abs(c / 600 - 0.3) < 0.08 for c in counts), counts  # 3 of 10, first calls not favoured


def test_audited_outputs_are_copies_taken_when_the_call_returned(audit_folder: Path) -> None:
    audit = _audit(2, 1, folder=audit_folder)
    outputs = [torch.full((4,), float(i)) for i in range(6)]
    _run(audit, outputs)
    for out in outputs:
        out.fill_(-1.0)  # a candidate rewriting its outputs later does not change what was captured
    kept = audit.finish()
    assert len(kept) == 2
    for call, share in kept:
        assert torch.equal(open_share(share.header, "cpu", audit_folder).tree, torch.full((4,), float(call - 1)))


def test_buffers_are_allocated_once_one_per_kept_call_and_reused(audit_folder: Path) -> None:
    audit = _audit(3, 2, folder=audit_folder)
    _run(audit, [(torch.randn(8), torch.randn(2, 3))])
    first = _buffers(audit)
    assert len(first) == 3  # size buffers: a call not kept is not copied
    _run(audit, [(torch.randn(8), torch.randn(2, 3)) for _ in range(50)])
    assert _buffers(audit) == first
    assert len(list(audit_folder.iterdir())) == 3


def test_outputs_that_change_shape_are_still_captured(audit_folder: Path) -> None:
    audit = _audit(1, 0, folder=audit_folder)
    _run(audit, [torch.ones(3)] + [torch.ones(5)] * 20)
    (call, kept), = audit.finish()
    assert open_share(kept.header, "cpu", audit_folder).tree.shape == ((3,) if call == 1 else (5,))
    assert len(list(audit_folder.iterdir())) == 1  # the buffers not kept are gone


def test_a_thread_running_when_the_timer_stopped_is_caught_even_if_it_ended_before_the_audit(stamped_threads) -> None:
    timer = CpuTimer()
    audit = _audit(2, 0, stamped_threads, timer)
    out = torch.randn(4)
    pending = threading.Thread(target=lambda: (time.sleep(0.02), out.relu_()))

    def forward() -> torch.Tensor:  # hands the work to a thread and returns at once
        pending.start()
        return out

    _, outputs = timer.time_calls(forward, [()])
    pending.join()  # the thread has finished: a count of live threads would now see nothing
    audit(1, outputs[0])
    assert [v["code"] for v in audit.violations] == ["thread-left-running"]


def test_threads_joined_inside_the_timed_batch_are_not_a_violation(stamped_threads) -> None:
    timer = CpuTimer()
    audit = _audit(2, 0, stamped_threads, timer)

    def forward() -> torch.Tensor:
        helper = threading.Thread(target=time.sleep, args=(0.005,))
        helper.start()
        helper.join()
        return torch.ones(2)

    _, outputs = timer.time_calls(forward, [(), ()])
    for call, out in enumerate(outputs, 1):
        audit(call, out)
    assert audit.violations == []

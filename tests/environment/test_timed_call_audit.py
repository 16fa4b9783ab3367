"""The audit of timed calls (candidate_worker.TimedCallAudit): a uniform sample, captured into
buffers that every timed call uses alike, so the allocator does not reveal which calls were audited;
and a thread a timed call left running when its batch's timer stopped, however soon it ended."""

from __future__ import annotations

import random
import threading
import time

import torch

from cuda_agent.environment.candidate_worker import TimedCallAudit
from cuda_agent.environment.loading import copy_tree_into
from cuda_agent.environment.thread_starts import ThreadStartLog
from cuda_agent.environment.timing import CpuTimer


def _audit(size: int, seed: int, threads: ThreadStartLog | None = None, timer: CpuTimer | None = None) -> TimedCallAudit:
    return TimedCallAudit(size, random.Random(seed), threads or ThreadStartLog(), timer or CpuTimer())


def _run(audit: TimedCallAudit, outputs: list) -> None:
    for out in outputs:
        audit(audit.seen + 1, out)


def _buffer_addresses(audit: TimedCallAudit) -> set[int]:
    trees = [tree for _, tree in audit.kept] + (audit._spares or [])
    return {t.data_ptr() for tree in trees for t in (tree if isinstance(tree, tuple) else (tree,))}


def test_every_call_is_audited_with_the_same_probability() -> None:
    counts = [0] * 10
    for seed in range(3000):
        audit = _audit(3, seed)
        _run(audit, [torch.full((2,), float(i)) for i in range(10)])
        for call, _ in audit.kept:
            counts[call - 1] += 1
    assert all(abs(c / 3000 - 0.3) < 0.04 for c in counts), counts  # 3 of 10, first calls not favoured


def test_audited_outputs_are_copies_taken_when_the_call_returned() -> None:
    audit = _audit(2, 1)
    outputs = [torch.full((4,), float(i)) for i in range(6)]
    _run(audit, outputs)
    for out in outputs:
        out.fill_(-1.0)  # a candidate rewriting its outputs later does not change what was captured
    assert len(audit.kept) == 2
    for call, kept in audit.kept:
        assert torch.equal(kept, torch.full((4,), float(call - 1)))
        assert all(kept.data_ptr() != out.data_ptr() for out in outputs)


def test_buffers_are_allocated_once_and_reused_by_every_call() -> None:
    audit = _audit(3, 2)
    _run(audit, [(torch.randn(8), torch.randn(2, 3))])
    first = _buffer_addresses(audit)
    assert len(first) == 2 * 4  # size + 1 buffers, two tensors each
    _run(audit, [(torch.randn(8), torch.randn(2, 3)) for _ in range(50)])
    assert _buffer_addresses(audit) == first


def test_outputs_that_change_shape_are_still_captured() -> None:
    audit = _audit(1, 0)
    _run(audit, [torch.ones(3)] + [torch.ones(5)] * 20)
    (call, kept), = audit.kept
    assert kept.shape == ((3,) if call == 1 else (5,))


def test_copy_tree_into_refuses_trees_that_differ() -> None:
    dst = {"a": torch.zeros(2), "b": [torch.zeros(3), 4]}
    assert copy_tree_into(dst, {"a": torch.ones(2), "b": [torch.ones(3), 4]})
    assert torch.equal(dst["b"][0], torch.ones(3))
    assert not copy_tree_into(dst, {"a": torch.ones(2), "b": [torch.ones(3), 5]})  # non-tensor leaf
    assert not copy_tree_into(dst, {"a": torch.ones(3), "b": [torch.ones(3), 4]})  # shape
    assert not copy_tree_into(dst, {"a": torch.ones(2, dtype=torch.float64), "b": [torch.ones(3), 4]})  # dtype
    assert not copy_tree_into(dst, {"a": torch.ones(2)})  # structure


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

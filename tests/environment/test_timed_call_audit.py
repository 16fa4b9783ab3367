"""The audit of timed calls (candidate_worker.TimedCallAudit): a uniform sample, captured into
buffers that every timed call uses alike, so the allocator does not reveal which calls were audited."""

from __future__ import annotations

import random

import torch

from cuda_agent.environment.candidate_worker import TimedCallAudit
from cuda_agent.environment.loading import copy_tree_into


def _run(audit: TimedCallAudit, outputs: list) -> None:
    for out in outputs:
        audit(audit.seen + 1, out)


def _buffer_addresses(audit: TimedCallAudit) -> set[int]:
    trees = [tree for _, tree in audit.kept] + (audit._spares or [])
    return {t.data_ptr() for tree in trees for t in (tree if isinstance(tree, tuple) else (tree,))}


def test_every_call_is_audited_with_the_same_probability() -> None:
    counts = [0] * 10
    for seed in range(3000):
        audit = TimedCallAudit(3, random.Random(seed))
        _run(audit, [torch.full((2,), float(i)) for i in range(10)])
        for call, _ in audit.kept:
            counts[call - 1] += 1
    assert all(abs(c / 3000 - 0.3) < 0.04 for c in counts), counts  # 3 of 10, first calls not favoured


def test_audited_outputs_are_copies_taken_when_the_call_returned() -> None:
    audit = TimedCallAudit(2, random.Random(1))
    outputs = [torch.full((4,), float(i)) for i in range(6)]
    _run(audit, outputs)
    for out in outputs:
        out.fill_(-1.0)  # a candidate rewriting its outputs later does not change what was captured
    assert len(audit.kept) == 2
    for call, kept in audit.kept:
        assert torch.equal(kept, torch.full((4,), float(call - 1)))
        assert all(kept.data_ptr() != out.data_ptr() for out in outputs)


def test_buffers_are_allocated_once_and_reused_by_every_call() -> None:
    audit = TimedCallAudit(3, random.Random(2))
    _run(audit, [(torch.randn(8), torch.randn(2, 3))])
    first = _buffer_addresses(audit)
    assert len(first) == 2 * 4  # size + 1 buffers, two tensors each
    _run(audit, [(torch.randn(8), torch.randn(2, 3)) for _ in range(50)])
    assert _buffer_addresses(audit) == first


def test_outputs_that_change_shape_are_still_captured() -> None:
    audit = TimedCallAudit(1, random.Random(0))
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

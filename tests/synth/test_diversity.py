"""Diversity measures: the op-sequence cap keeps the earliest seeds, near-duplicate clusters follow
"same ops, same shapes up to scale", and coverage counts every family of the seed-op list."""

from __future__ import annotations

import pytest

from cuda_agent.synth.dataset import DatasetInfo, DatasetWriter, read_dataset, stats
from cuda_agent.synth.diversity import (cap_op_sequences, family_coverage, near_duplicate_clusters,
                                        op_sequence_cap, same_up_to_scale)
from cuda_agent.synth.records import TaskRecord


def _task(seed: int, ops: list[str]) -> TaskRecord:
    return TaskRecord(f"# task {seed}\n", ops, "deterministic", seed, eager_ms=1.0, device="cpu")


def test_the_cap_keeps_the_lowest_seeds_of_an_over_represented_sequence() -> None:
    records = [_task(seed, ["torch.relu"]) for seed in (9, 3, 7, 5)] + [_task(seed, [f"torch.op{seed}"])
                                                                         for seed in range(10, 26)]
    assert op_sequence_cap(0.1, len(records)) == 2
    kept, left_out = cap_op_sequences(records, 0.1)
    assert sorted(r.seed for r in left_out) == [7, 9] and len(kept) == 18
    assert [r.seed for r in kept][:2] == [3, 5]  # input order kept
    assert len(cap_op_sequences(records, 0.001)[0]) == 17  # at least one task per sequence, whatever the share
    with pytest.raises(ValueError, match="max_op_sequence_share must be in"):
        cap_op_sequences(records, 0.0)


def test_the_written_set_holds_the_capped_tasks_and_the_card_counts_the_rest(tmp_path) -> None:
    records = [_task(seed, ["torch.relu"]) for seed in range(3)] + [_task(seed, [f"torch.op{seed}"])
                                                                    for seed in range(3, 10)]
    info = DatasetInfo(device="cpu", eager_window_ms=(0.1, 100.0), max_op_sequence_share=0.2)  # 2 of 10
    with DatasetWriter.open(tmp_path, info) as writer:
        writer.append(records)
        numbers = writer.finalize()
    assert sorted(r.seed for r in read_dataset(tmp_path)) == [0, 1, *range(3, 10)]
    assert numbers["tasks"] == 9 and numbers["capped"] == 1 and numbers == stats(tmp_path)
    assert "left out by the op-sequence cap" in (tmp_path / "README.md").read_text()


def test_shapes_the_same_up_to_scale_differ_along_one_axis_at_most() -> None:
    assert same_up_to_scale([(512, 64), (512, 64)], [(4096, 64), (4096, 64)])
    assert same_up_to_scale([(8, 3, 32, 32)], [(8, 3, 32, 32)])
    assert not same_up_to_scale([(512, 64)], [(1024, 128)])  # two axes: another problem
    assert not same_up_to_scale([(512, 64)], [(512, 64, 1)])
    assert not same_up_to_scale([(512, 64)], [(512, 64), (512, 64)])


def test_clusters_join_same_sequence_tasks_whose_shapes_match_up_to_scale() -> None:
    a, b, c, d, e = (_task(seed, ops) for seed, ops in enumerate(
        [["torch.relu", "torch.exp"], ["torch.relu", "torch.exp"], ["torch.relu", "torch.exp"],
         ["torch.exp", "torch.relu"], ["torch.relu", "torch.exp"]]))
    shapes = {a.id: [(512, 64)], b.id: [(2048, 64)], c.id: [(2048, 32)], d.id: [(512, 64)], e.id: [(7, 7)]}
    clusters = near_duplicate_clusters([a, b, c, d, e], shapes)
    assert clusters == [sorted([a.id, b.id, c.id])]  # c joins through b; d has other ops; e two other sizes


def test_coverage_counts_seed_ops_used_per_family_beside_the_catalogue() -> None:
    seed_families = {"torch.relu": "activation", "torch.gelu": "activation", "torch.exp": "elementwise",
                     "torch.conv2d": "convolution"}
    records = [_task(0, ["torch.relu", "torch.exp"]), _task(1, ["torch.relu", "torch.mystery"])]
    assert family_coverage(records, seed_families) == [
        {"family": "activation", "seed_ops": 2, "ops_used": 1, "tasks": 2},
        {"family": "convolution", "seed_ops": 1, "ops_used": 0, "tasks": 0},
        {"family": "elementwise", "seed_ops": 1, "ops_used": 1, "tasks": 1},
        {"family": "unknown", "seed_ops": 0, "ops_used": 1, "tasks": 1},
    ]

"""Diversity of a task set, measured rather than assumed.

- **Op-sequence cap.** No operator sequence may hold more than a stated share of a dataset
  (:data:`DEFAULT_MAX_OP_SEQUENCE_SHARE`): a composer that keeps drawing the same few ops would
  otherwise fill the set with one problem. The cap is applied when the dataset is written; the
  tasks kept are those of the lowest composer seeds (then ids), so the choice is deterministic.
- **Near-duplicate clusters.** Two tasks are near-duplicates when they apply the same operator
  sequence to inputs of the same shapes up to scale: the same number of inputs with the same
  ranks, whose sizes differ along one axis at most (as the composer's sizing scales a batch
  dimension). Clusters are the connected groups of that relation.
- **Op-family coverage.** For each family of the seed-op catalogue: its operators, how many of
  them some task uses, and how many tasks use one.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from cuda_agent.synth.records import TaskRecord

DEFAULT_MAX_OP_SEQUENCE_SHARE = 0.005
"""Most tasks one operator sequence may have, as a share of the dataset (at least one task):
0.5 %, 30 tasks of 6,000."""

Shapes = Sequence[Sequence[int]]


def op_sequence_cap(share: float, tasks: int) -> int:
    """Tasks allowed per operator sequence in a dataset of ``tasks`` tasks (at least 1)."""
    return max(1, math.floor(share * tasks))


def cap_op_sequences(records: Sequence[TaskRecord], share: float) -> tuple[list[TaskRecord], list[TaskRecord]]:
    """Split ``records`` into those kept under the op-sequence cap and those left out.

    The cap is :func:`op_sequence_cap` of the whole set's size; within an operator sequence the
    tasks of the lowest ``(seed, id)`` are kept. Both lists keep the input order.

    Raises:
        ValueError: ``share`` is not in (0, 1].
    """
    if not 0 < share <= 1:
        raise ValueError(f"max_op_sequence_share must be in (0, 1], got {share!r}")
    cap = op_sequence_cap(share, len(records))
    ranked: dict[tuple[str, ...], list[TaskRecord]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.seed, r.id)):
        ranked[tuple(record.ops)].append(record)
    left_out = {record.id for group in ranked.values() for record in group[cap:]}
    return ([record for record in records if record.id not in left_out],
            [record for record in records if record.id in left_out])


def same_up_to_scale(a: Shapes, b: Shapes) -> bool:
    """Whether two tasks' input shapes differ along one axis at most (same count and ranks)."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        return False
    axes = {axis for x, y in zip(a, b) for axis, (p, q) in enumerate(zip(x, y)) if p != q}
    return len(axes) <= 1


def near_duplicate_clusters(records: Sequence[TaskRecord], shapes: Mapping[str, Shapes]) -> list[list[str]]:
    """Groups of two or more task ids with the same op sequence and shapes the same up to scale.

    Args:
        records: the tasks.
        shapes: task id -> input shapes (tasks missing here are in no cluster).

    Returns:
        Clusters as sorted id lists, largest first (then by first id).
    """
    by_sequence: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for record in records:
        if record.id in shapes:
            by_sequence[tuple(record.ops)].append(record.id)
    parent: dict[str, str] = {}

    def root(task: str) -> str:
        while parent.get(task, task) != task:
            task = parent[task]
        return task

    for ids in by_sequence.values():
        for i, first in enumerate(ids):
            for second in ids[i + 1:]:
                if same_up_to_scale(shapes[first], shapes[second]):
                    parent[root(second)] = root(first)
    groups: dict[str, list[str]] = defaultdict(list)
    for ids in by_sequence.values():
        for task in ids:
            groups[root(task)].append(task)
    clusters = [sorted(group) for group in groups.values() if len(group) > 1]
    return sorted(clusters, key=lambda group: (-len(group), group[0]))


def op_sequence_counts(records: Sequence[TaskRecord]) -> Counter[tuple[str, ...]]:
    """Tasks per operator sequence."""
    return Counter(tuple(record.ops) for record in records)


def family_coverage(records: Sequence[TaskRecord], seed_families: Mapping[str, str]) -> list[dict[str, Any]]:
    """Per family of the seed-op catalogue: ``family``, ``seed_ops`` (in the catalogue),
    ``ops_used`` (of those, used by some task), ``tasks`` (using at least one of its ops).

    Operators of the tasks that the catalogue lacks are counted under the family ``unknown``.
    Rows are sorted by family name.
    """
    used_ops = {op for record in records for op in record.ops}
    per_family: dict[str, dict[str, Any]] = defaultdict(lambda: {"seed_ops": 0, "ops_used": 0, "tasks": 0})
    for op, family in seed_families.items():
        per_family[family]["seed_ops"] += 1
        per_family[family]["ops_used"] += op in used_ops
    for op in used_ops - set(seed_families):
        per_family["unknown"]["ops_used"] += 1
    for record in records:
        for family in {seed_families.get(op, "unknown") for op in record.ops}:
            per_family[family]["tasks"] += 1
    return [{"family": family, **counts} for family, counts in sorted(per_family.items())]

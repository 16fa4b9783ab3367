"""Which ATen operators ``forward`` ran (runtime guard ``torch-compute-at-runtime``).

The static guards read the sources; this sees what actually executed. Every ATen operator the
dispatcher runs during a verification call — from Python, from the extension's C++, or from Python
reached back through pybind11 — passes through a recording ``TorchDispatchMode`` (it sees operators,
not kernels: no profiler, no CUPTI, microseconds per operator). Allocation, views, copies and fills
are the only operators a kernel's host code needs; anything else means PyTorch computed (part of)
the answer.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cuda_agent.environment.guards.vocabulary import ALLOWED_TENSOR_METHODS, ALLOWED_TORCH_CALLS, CPP_ALLOWED_PATHS, TENSOR

_DISPATCHER_INTERNALS = frozenset({
    # What the allowed calls (vocabulary.py) dispatch to underneath.
    "_to_copy", "_reshape_alias", "_unsafe_view", "alias", "slice", "lift_fresh", "lift_fresh_copy",
    "resolve_conj", "resolve_neg", "detach_", "resize_", "set_", "as_strided_", "unsqueeze_", "squeeze_",
    "_local_scalar_dense", "is_nonzero", "scalar_tensor", "_has_compatible_shallow_copy_type", "_unsafe_split",
    "split_with_sizes", "unsafe_split", "unsafe_chunk", "t_", "transpose_", "item", "result_type", "record_stream",
})

ALLOWED_RUNTIME_OPS = frozenset(
    {name.rsplit(".", 1)[-1] for name, kind in ALLOWED_TORCH_CALLS.items() if kind == TENSOR}
    | {name for name, kind in ALLOWED_TENSOR_METHODS.items() if kind == TENSOR}
    | {path for path in CPP_ALLOWED_PATHS if path.isidentifier()}
    | _DISPATCHER_INTERNALS
)


VALUE_SHAPED_TAGS = frozenset({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output})
"""ATen's tags for operators whose output's shape (``unique``, ``nonzero``, ``masked_select``) or
host value (``item``) follows from their inputs' values, not only from their shapes."""


class _Recorder(TorchDispatchMode):
    """The names of the operators dispatched under it, in order; with ``keep``, those it admits."""

    def __init__(self, keep: Callable[[Any], bool] | None = None) -> None:
        super().__init__()
        self.keep = keep
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.keep is None or self.keep(func):
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recorded_aten_ops() -> Iterator[list[str]]:
    """Yield a list that holds, as the block runs, the names of the ATen operators it dispatches."""
    with _Recorder() as recorder:
        yield recorder.names


@contextlib.contextmanager
def recorded_value_shaped_ops() -> Iterator[set[str]]:
    """Yield a set that holds, once the block has run, the names of the operators it dispatched
    whose output's shape or host value depends on their inputs' values (:data:`VALUE_SHAPED_TAGS`):
    where there are none, the block's outputs' shapes follow from its inputs' shapes alone."""
    names: set[str] = set()
    with _Recorder(keep=lambda func: not VALUE_SHAPED_TAGS.isdisjoint(func.tags)) as recorder:
        yield names
    names.update(recorder.names)


def compute_ops(names: list[str]) -> list[str]:
    """The recorded operators that compute (sorted, without repeats)."""
    return sorted(set(names) - ALLOWED_RUNTIME_OPS)

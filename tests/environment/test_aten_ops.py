"""The runtime ATen-operator record behind ``torch-compute-at-runtime``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cuda_agent.environment.aten_ops import compute_ops, recorded_aten_ops, recorded_value_shaped_ops


def _computed(fn) -> list[str]:
    with recorded_aten_ops() as ops:
        fn()
    return compute_ops(ops)


def test_allocation_views_copies_and_casts_are_not_compute() -> None:
    x = torch.randn(8, 8)
    assert _computed(lambda: torch.empty_like(x).copy_(x)) == []
    assert _computed(lambda: x.t().contiguous().view(-1)) == []
    assert _computed(lambda: (torch.zeros(3), torch.full((2,), 1.0), x.to(torch.float16), x.new_empty(4))) == []


def test_torch_compute_is_recorded_by_name() -> None:
    x = torch.randn(8, 8)
    assert _computed(lambda: F.relu(x)) == ["relu"]
    assert _computed(lambda: (x @ x).sum()) == ["mm", "sum"]


def test_compute_reached_through_a_tensor_method_lookup_is_recorded() -> None:
    """What a pybind11 ``x.attr("relu")()`` from C++ amounts to: a dynamic lookup, still dispatched."""
    x = torch.randn(8)
    assert _computed(lambda: getattr(x, "re" + "lu")()) == ["relu"]


def test_operators_whose_output_shape_follows_values_are_told_apart() -> None:
    """What the synthesis filter's ``rounding-shape`` rule keys on: only these outputs' shapes can
    differ between float64 and float32."""
    x = torch.randn(64)
    for fn, expected in ((lambda: torch.unique(x), {"_unique2"}), (lambda: torch.nonzero(x > 0), {"nonzero"}),
                         (lambda: x[x > 0], {"index"}), (lambda: float(x.sum()), {"_local_scalar_dense"}),
                         (lambda: F.relu(x @ x.new_ones(64, 8)).sum(dim=0), set())):
        with recorded_value_shaped_ops() as value_shaped:
            fn()
        assert value_shaped == expected, fn

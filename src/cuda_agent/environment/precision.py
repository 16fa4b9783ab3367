"""Precision policies: when is a candidate's output "the same" as the reference's?

Every policy first checks structure (same nesting, shapes, dtypes) and the non-finite pattern
(NaN where the fp32 reference has NaN, ±Inf with the same sign), then its own numeric rule:

- ``faithful`` (default): the candidate's error against a float64 run of the reference may not
  exceed ``error_ratio_limit`` times the fp32 eager reference's own error (plus a floor of
  ``ulp_floor`` fp32 epsilons relative to the output's magnitude, well below fp16/bf16 rounding),
  in both the L2 and the max norm. Reduction-order differences pass; fp16/bf16/TF32 downcasts fail.
  Calibration: docs/precision.md.
- ``tf32``: the same rule, measured against the eager reference run with TF32 enabled; speed-ups
  are then taken against TF32-on baselines only.
- ``kernelbench``: ``allclose`` against the fp32 reference, atol = rtol = 1e-4 for fp32, 1e-2 for
  fp16/bf16 (KernelBench's dtype-aware tolerances).
- ``cuda-agent``: ``allclose`` with atol = rtol = 1e-2 (the CUDA Agent paper's check).

Loose policies admit TF32-level error, so their speed-ups use the faster of the TF32-off/on
baselines: no result rests on a handicapped baseline.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, Literal

import torch

from cuda_agent.registry import Registry

BaselineChoice = Literal["tf32_off", "tf32_on", "fastest"]


@dataclass(frozen=True)
class References:
    """Reference outputs for one input set. ``fp64``/``tf32`` are None when not computed or unavailable."""

    fp32: Any  # eager at the task's own dtypes, TF32 disabled
    fp64: Any | None = None  # the reference run in float64
    tf32: Any | None = None  # eager with TF32 enabled (CUDA only)


@dataclass(frozen=True)
class Comparison:
    passed: bool
    message: str
    max_abs_err: float | None = None
    error_ratio: float | None = None  # candidate error / eager error (faithful-style policies)
    fallback: str | None = None  # policy actually applied when the requested one could not be


@dataclass(frozen=True)
class _LeafResult:
    passed: bool
    message: str
    max_abs_err: float
    error_ratio: float | None = None


class PrecisionPolicy(ABC):
    """Compares a candidate output tree with reference trees."""

    name: str
    baseline: BaselineChoice
    needs_float64: bool = False
    needs_tf32_reference: bool = False

    def compare(self, candidate: Any, refs: References) -> Comparison:
        leaves = _paired_leaves(candidate, refs.fp32)
        if isinstance(leaves, str):
            return Comparison(False, leaves)
        ref64_leaves = _flatten(refs.fp64) if refs.fp64 is not None else None
        tf32_leaves = _flatten(refs.tf32) if refs.tf32 is not None else None
        worst_err, worst_ratio = 0.0, None
        for i, (path, cand, ref) in enumerate(leaves):
            if not isinstance(ref, torch.Tensor):
                if cand != ref and not (_is_nan(cand) and _is_nan(ref)):
                    return Comparison(False, f"output{path}: value {cand!r} != expected {ref!r}")
                continue
            problem = _structure_problem(path, cand, ref)
            if problem:
                return Comparison(False, problem, worst_err)
            if not (ref.is_floating_point() or ref.is_complex()):
                if not torch.equal(cand, ref):
                    mismatches = int((cand != ref).sum())
                    return Comparison(False, f"output{path}: {mismatches} of {ref.numel()} integer/bool elements differ", worst_err)
                continue
            problem = _nonfinite_problem(path, cand, ref)
            if problem:
                return Comparison(False, problem, worst_err)
            leaf = self.check_leaf(
                path, cand, ref,
                ref64_leaves[i][1] if ref64_leaves else None,
                tf32_leaves[i][1] if tf32_leaves else None,
            )
            worst_err = max(worst_err, leaf.max_abs_err)
            if leaf.error_ratio is not None:
                worst_ratio = max(worst_ratio or 0.0, leaf.error_ratio)
            if not leaf.passed:
                return Comparison(False, leaf.message, worst_err, worst_ratio)
        summary = f"max abs err {worst_err:.3g}" + (f", error ratio {worst_ratio:.3g}" if worst_ratio is not None else "")
        return Comparison(True, summary, worst_err, worst_ratio)

    @abstractmethod
    def check_leaf(self, path: str, cand: torch.Tensor, ref32: torch.Tensor,
                   ref64: torch.Tensor | None, ref_tf32: torch.Tensor | None) -> _LeafResult:
        """Numeric rule for one floating-point tensor whose structure and NaN/Inf pattern match."""


class AllclosePolicy(PrecisionPolicy):
    """``|cand - ref| <= atol + rtol * |ref|`` elementwise against the fp32 reference.

    ``atol`` is capped at ``TINY_OUTPUT_ATOL_SHARE`` of the output's largest magnitude: on an output
    that is tiny next to the tolerance (``y = 1e-6 * x``), a plain atol would accept all zeros.
    """

    def __init__(self, name: str, tolerances: dict[torch.dtype, float], default_tol: float) -> None:
        self.name = name
        self.baseline = "fastest"
        self.tolerances = tolerances
        self.default_tol = default_tol

    def tolerance(self, dtype: torch.dtype) -> float:
        return self.tolerances.get(dtype, self.default_tol)

    def check_leaf(self, path, cand, ref32, ref64, ref_tf32) -> _LeafResult:
        tol = self.tolerance(ref32.dtype)
        finite = torch.isfinite(ref32)
        c, r = cand[finite].double(), ref32[finite].double()
        if c.numel() == 0:
            return _LeafResult(True, "no finite elements", 0.0)
        diff = (c - r).abs()
        atol = min(tol, TINY_OUTPUT_ATOL_SHARE * float(r.abs().max()))
        bad = diff > atol + tol * r.abs()
        max_err = float(diff.max())
        if bool(bad.any()):
            capped = f" (atol capped at {atol:.3g}: the output is tiny next to the tolerance)" if atol < tol else ""
            return _LeafResult(False, f"output{path}: {int(bad.sum())} of {r.numel()} elements outside "
                               f"atol=rtol={tol:g}{capped} (max abs err {max_err:.3g})", max_err)
        return _LeafResult(True, "", max_err)


class FaithfulPolicy(PrecisionPolicy):
    """Candidate error vs float64 bounded by a multiple of the eager reference's own error."""

    needs_float64 = True

    def __init__(self, name: str, error_ratio_limit: float, ulp_floor: float, use_tf32_reference: bool) -> None:
        self.name = name
        self.error_ratio_limit = error_ratio_limit
        self.ulp_floor = ulp_floor
        self.needs_tf32_reference = use_tf32_reference
        self.baseline = "tf32_on" if use_tf32_reference else "tf32_off"
        self._fallback_policy = KERNELBENCH

    def compare(self, candidate: Any, refs: References) -> Comparison:
        if refs.fp64 is None:  # the reference cannot run in float64 (an op without a double kernel)
            result = self._fallback_policy.compare(candidate, refs)
            return Comparison(result.passed, result.message, result.max_abs_err, None, self._fallback_policy.name)
        return super().compare(candidate, refs)

    def check_leaf(self, path, cand, ref32, ref64, ref_tf32) -> _LeafResult:
        eager = ref_tf32 if (self.needs_tf32_reference and ref_tf32 is not None) else ref32
        finite = torch.isfinite(eager) & torch.isfinite(ref64)
        c = cand[finite].to(torch.complex128 if cand.is_complex() else torch.float64)
        exact = ref64[finite].to(c.dtype)
        e = eager[finite].to(c.dtype)
        if c.numel() == 0:
            return _LeafResult(True, "no finite elements", 0.0)
        eps = torch.finfo(ref32.dtype).eps
        cand_err, eager_err = (c - exact).abs(), (e - exact).abs()
        scale = exact.abs()
        k, floor = self.error_ratio_limit, self.ulp_floor * eps
        l2_cand, l2_eager = float(torch.linalg.vector_norm(cand_err)), float(torch.linalg.vector_norm(eager_err))
        max_cand, max_eager = float(cand_err.max()), float(eager_err.max())
        l2_tol = k * l2_eager + floor * float(torch.linalg.vector_norm(scale))
        max_tol = k * max_eager + floor * float(scale.max())
        ratio = l2_cand / l2_eager if l2_eager > 0 else (0.0 if l2_cand == 0 else math.inf)
        if l2_cand > l2_tol or max_cand > max_tol:
            which = "L2" if l2_cand > l2_tol else "max"
            return _LeafResult(
                False,
                f"output{path}: error vs float64 ({which} norm) exceeds {k:g}x the fp32 eager error: "
                f"L2 {l2_cand:.3g} (eager {l2_eager:.3g}), max {max_cand:.3g} (eager {max_eager:.3g}); "
                "looks like reduced precision (fp16/bf16/TF32) or a wrong result",
                max_cand, ratio,
            )
        return _LeafResult(True, "", max_cand, ratio)


@contextlib.contextmanager
def tf32_enabled(enabled: bool) -> Iterator[None]:
    """Set TF32 for both cuBLAS matmuls and cuDNN convolutions, restoring both afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


PYTORCH_DEFAULT_TF32 = (False, True)
"""PyTorch's defaults for ``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``: TF32 off for matmuls, on for cuDNN convolutions."""


@contextlib.contextmanager
def tf32_setting(setting: str) -> Iterator[None]:
    """A baseline variant's TF32 setting: ``off``, ``on`` (both backends), or ``default``
    (PyTorch's defaults, :data:`PYTORCH_DEFAULT_TF32`), restoring the flags afterwards."""
    if setting in ("off", "on"):
        with tf32_enabled(setting == "on"):
            yield
        return
    if setting != "default":
        raise ValueError(f"unknown TF32 setting {setting!r}; valid: off, on, default")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = PYTORCH_DEFAULT_TF32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _flatten(tree: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, (list, tuple)):
        return [leaf for i, v in enumerate(tree) for leaf in _flatten(v, f"{path}[{i}]")]
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _flatten(v, f"{path}[{k!r}]")]
    return [(path, tree)]


def _shape_of(tree: Any) -> Any:
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, [_shape_of(v) for v in tree])
    if isinstance(tree, dict):
        return ("dict", [(k, _shape_of(v)) for k, v in tree.items()])
    return "tensor" if isinstance(tree, torch.Tensor) else "scalar"


def _paired_leaves(candidate: Any, reference: Any) -> list[tuple[str, Any, Any]] | str:
    if _shape_of(candidate) != _shape_of(reference):
        return (f"output structure differs: expected {_describe(reference)}, got {_describe(candidate)}")
    return [(p, c, r) for (p, c), (_, r) in zip(_flatten(candidate), _flatten(reference))]


def _describe(tree: Any) -> str:
    if isinstance(tree, torch.Tensor):
        return f"Tensor{tuple(tree.shape)}"
    if isinstance(tree, (list, tuple)):
        return f"{type(tree).__name__} of {len(tree)}"
    if isinstance(tree, dict):
        return f"dict with keys {sorted(tree)}"
    return type(tree).__name__


def _structure_problem(path: str, cand: Any, ref: torch.Tensor) -> str | None:
    if not isinstance(cand, torch.Tensor):
        return f"output{path}: expected a tensor, got {type(cand).__name__}"
    if cand.shape != ref.shape:
        return f"output{path}: shape {tuple(cand.shape)} != expected {tuple(ref.shape)}"
    if cand.dtype != ref.dtype:
        return f"output{path}: dtype {cand.dtype} != expected {ref.dtype}"
    return None


def _nonfinite_problem(path: str, cand: torch.Tensor, ref: torch.Tensor) -> str | None:
    ref_nan, cand_nan = torch.isnan(ref), torch.isnan(cand)
    if not torch.equal(ref_nan, cand_nan):
        return f"output{path}: NaN pattern differs ({int(cand_nan.sum())} NaN, expected {int(ref_nan.sum())})"
    if ref.is_complex():
        return None
    ref_inf, cand_inf = torch.isinf(ref), torch.isinf(cand)
    if not torch.equal(ref_inf, cand_inf) or not torch.equal(torch.sign(ref[ref_inf]), torch.sign(cand[cand_inf])):
        return f"output{path}: Inf pattern differs ({int(cand_inf.sum())} Inf, expected {int(ref_inf.sum())})"
    return None


# Calibrated in docs/precision.md (bench/precision_calibration.py, CPU). The limit must admit honest
# reorderings where cancellation makes eager's own error large (layernorm of randn + 1024 summed
# sequentially: ratio up to 25) yet reject fp16/TF32 operands where eager itself sums a long K
# sequentially (matmul, K = 65536: ratio down to 46). The floor (fp32 eps, relative to the float64
# result's norm) must admit sequential fp32 sums of 1M terms (up to ~320 eps) yet stay below the
# fp16/TF32 operand-rounding error on sign-symmetric inputs (~1300 eps and up).
FAITHFUL_ERROR_RATIO_LIMIT = 32.0
TINY_OUTPUT_ATOL_SHARE = 0.1
FAITHFUL_ULP_FLOOR = 512.0

KERNELBENCH = AllclosePolicy("kernelbench", {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}, 1e-4)
POLICIES: Registry[PrecisionPolicy] = Registry("precision policy")
POLICIES.register("faithful", FaithfulPolicy("faithful", FAITHFUL_ERROR_RATIO_LIMIT, FAITHFUL_ULP_FLOOR, use_tf32_reference=False))
POLICIES.register("tf32", FaithfulPolicy("tf32", FAITHFUL_ERROR_RATIO_LIMIT, FAITHFUL_ULP_FLOOR, use_tf32_reference=True))
POLICIES.register("kernelbench", KERNELBENCH)
POLICIES.register("cuda-agent", AllclosePolicy("cuda-agent", {}, 1e-2))

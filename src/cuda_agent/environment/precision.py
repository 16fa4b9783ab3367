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

This module holds the policies (names, rules, numbers) and needs no torch: the trusted parent picks
and reports a policy without importing it. The comparisons themselves run in the reference worker
(:mod:`comparison`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from cuda_agent.registry import Registry

if TYPE_CHECKING:
    from cuda_agent.environment.comparison import Comparison, References

BaselineChoice = Literal["tf32_off", "tf32_on", "fastest"]

# Calibrated in docs/precision.md (bench/precision_calibration.py, CPU). The limit must admit honest
# reorderings where cancellation makes eager's own error large (layernorm of randn + 1024 summed
# sequentially: ratio up to 25) yet reject fp16/TF32 operands where eager itself sums a long K
# sequentially (matmul, K = 65536: ratio down to 46). The floor (fp32 eps, relative to the float64
# result's norm) must admit sequential fp32 sums of 1M terms (up to ~320 eps) yet stay below the
# fp16/TF32 operand-rounding error on sign-symmetric inputs (~1300 eps and up).
FAITHFUL_ERROR_RATIO_LIMIT = 32.0
TINY_OUTPUT_ATOL_SHARE = 0.1
FAITHFUL_ULP_FLOOR = 512.0


@dataclass(frozen=True)
class PrecisionPolicy:
    """A named correctness rule and the baseline its speed-ups are taken against."""

    name: str
    baseline: BaselineChoice
    rule: Literal["allclose", "faithful"]

    @property
    def needs_float64(self) -> bool:
        return self.rule == "faithful"

    @property
    def needs_tf32_reference(self) -> bool:
        return False

    def compare(self, candidate: Any, refs: "References") -> "Comparison":
        """Compare a candidate output tree with the reference trees (imports torch)."""
        from cuda_agent.environment.comparison import compare

        return compare(self, candidate, refs)


@dataclass(frozen=True)
class AllclosePolicy(PrecisionPolicy):
    """``|cand - ref| <= atol + rtol * |ref|`` elementwise against the fp32 reference, with
    atol = rtol = the tolerance of the output's dtype. atol is capped at
    ``tiny_output_atol_share`` of the output's largest magnitude: on an output that is tiny next
    to the tolerance (``y = 1e-6 * x``), a plain atol would accept all zeros."""

    baseline: BaselineChoice = "fastest"
    rule: Literal["allclose", "faithful"] = "allclose"
    tolerances: dict[str, float] = field(default_factory=dict)
    """atol = rtol per dtype name (``float32``, ``float16``, ...)."""
    default_tol: float = 1e-4
    tiny_output_atol_share: float = TINY_OUTPUT_ATOL_SHARE

    def tolerance(self, dtype: str) -> float:
        return self.tolerances.get(dtype, self.default_tol)


@dataclass(frozen=True)
class FaithfulPolicy(PrecisionPolicy):
    """Candidate error vs float64 bounded by a multiple of the eager reference's own error; falls
    back to ``fallback`` when the reference cannot run in float64."""

    baseline: BaselineChoice = "tf32_off"
    rule: Literal["allclose", "faithful"] = "faithful"
    error_ratio_limit: float = FAITHFUL_ERROR_RATIO_LIMIT
    ulp_floor: float = FAITHFUL_ULP_FLOOR
    use_tf32_reference: bool = False
    fallback: AllclosePolicy = field(default_factory=lambda: KERNELBENCH)

    @property
    def needs_tf32_reference(self) -> bool:
        return self.use_tf32_reference


KERNELBENCH = AllclosePolicy("kernelbench", tolerances={"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}, default_tol=1e-4)
POLICIES: Registry[PrecisionPolicy] = Registry("precision policy")
POLICIES.register("faithful", FaithfulPolicy("faithful"))
POLICIES.register("tf32", FaithfulPolicy("tf32", baseline="tf32_on", use_tf32_reference=True))
POLICIES.register("kernelbench", KERNELBENCH)
POLICIES.register("cuda-agent", AllclosePolicy("cuda-agent", default_tol=1e-2))

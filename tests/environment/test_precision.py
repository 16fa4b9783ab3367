"""Precision policies: what counts as "the same output" as the reference.

The faithful policy is checked against honest fp32 kernels that only reorder their arithmetic
(they must pass) and against reduced-precision kernels (fp16, bf16, TF32) on sign-symmetric inputs,
where cancellation makes the lost mantissa bits visible (they must fail).
"""

from __future__ import annotations

import pytest
import torch

from cuda_agent.environment import POLICIES
from cuda_agent.environment.comparison import References, rounding_dependent_shape
from cuda_agent.environment.precision import FAITHFUL_ERROR_RATIO_LIMIT

FAITHFUL = POLICIES.get("faithful")
KERNELBENCH = POLICIES.get("kernelbench")
CUDA_AGENT = POLICIES.get("cuda-agent")


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def references(fn, *inputs: torch.Tensor) -> References:
    """fp32 and float64 references of ``fn`` (what the reference worker computes on CPU)."""
    return References(fp32=fn(*inputs), fp64=fn(*(t.double() for t in inputs)))


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to TF32 (10 explicit mantissa bits, round-to-nearest), as tensor cores do."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.fixture(scope="module")
def matmul_case() -> tuple[torch.Tensor, torch.Tensor, References]:
    a = torch.randn(128, 256, generator=generator(1))  # sign-symmetric: products cancel
    b = torch.randn(256, 96, generator=generator(2))
    return a, b, references(torch.matmul, a, b)


# -- faithful: honest reorderings pass ----------------------------------------------------------

def test_faithful_passes_blocked_matmul_with_reordered_k_sum(matmul_case) -> None:
    a, b, refs = matmul_case
    blocked = sum(a[:, k:k + 32] @ b[k:k + 32] for k in range(0, a.shape[1], 32))
    result = FAITHFUL.compare(blocked, refs)
    assert result.passed, result.message
    assert result.error_ratio is not None and result.error_ratio < FAITHFUL_ERROR_RATIO_LIMIT
    assert result.fallback is None


def test_faithful_passes_matmul_with_reversed_k_order(matmul_case) -> None:
    a, b, refs = matmul_case
    result = FAITHFUL.compare(a.flip(1) @ b.flip(0), refs)
    assert result.passed, result.message


def test_faithful_passes_row_sum_in_a_different_order() -> None:
    x = torch.randn(64, 4096, generator=generator(3))
    refs = references(lambda t: t.sum(-1), x)
    chunked_reversed = x.flip(-1).reshape(64, 64, 64).sum(-1).sum(-1)
    result = FAITHFUL.compare(chunked_reversed, refs)
    assert result.passed, result.message


def test_faithful_passes_a_hand_written_stable_softmax() -> None:
    x = 3 * torch.randn(32, 1024, generator=generator(4))
    refs = references(lambda t: torch.softmax(t, -1), x)
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    result = FAITHFUL.compare(e / e.sum(-1, keepdim=True), refs)
    assert result.passed, result.message


def test_faithful_passes_a_result_more_accurate_than_eager(matmul_case) -> None:
    a, b, refs = matmul_case
    result = FAITHFUL.compare((a.double() @ b.double()).float(), refs)
    assert result.passed and result.error_ratio < 1.0


def test_faithful_passes_exact_elementwise_op_with_zero_eager_error() -> None:
    x = torch.randn(1000, generator=generator(5))
    result = FAITHFUL.compare(torch.relu(x.clone()), references(torch.relu, x))
    assert result.passed and result.max_abs_err == 0.0


# -- faithful: reduced precision fails ---------------------------------------------------------

@pytest.mark.parametrize(
    "downcast",
    [
        pytest.param(lambda a, b: (a.half() @ b.half()).float(), id="fp16"),
        pytest.param(lambda a, b: (a.bfloat16() @ b.bfloat16()).float(), id="bf16"),
        pytest.param(lambda a, b: (round_to_tf32(a).double() @ round_to_tf32(b).double()).float(), id="tf32-simulated"),
    ],
)
def test_faithful_fails_reduced_precision_matmul_on_sign_symmetric_inputs(matmul_case, downcast) -> None:
    a, b, refs = matmul_case
    result = FAITHFUL.compare(downcast(a, b), refs)
    assert not result.passed
    assert f"exceeds {FAITHFUL_ERROR_RATIO_LIMIT:g}x the fp32 eager error" in result.message
    assert result.error_ratio > FAITHFUL_ERROR_RATIO_LIMIT


def test_tf32_rounding_helper_keeps_ten_mantissa_bits() -> None:
    x = torch.tensor([1.0 + 2.0**-10, 1.0 + 2.0**-12, 1.0 + 2.0**-11 + 2.0**-13])
    assert round_to_tf32(x).tolist() == [1.0 + 2.0**-10, 1.0, 1.0 + 2.0**-10]


def test_faithful_falls_back_to_kernelbench_without_float64_reference() -> None:
    ref = torch.randn(50, generator=generator(6))
    refs = References(fp32=ref, fp64=None)
    close = FAITHFUL.compare(ref + 5e-5, refs)
    assert close.passed and close.fallback == "kernelbench" and close.error_ratio is None
    far = FAITHFUL.compare(ref + 1e-3, refs)
    assert not far.passed and far.fallback == "kernelbench"
    assert "atol=rtol=0.0001" in far.message


# -- checks shared by every policy -------------------------------------------------------------

ALL_POLICIES = POLICIES.names()


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_nan_where_the_reference_has_none_fails(policy: str) -> None:
    ref = torch.randn(10, generator=generator(7))
    cand = ref.clone()
    cand[3] = float("nan")
    result = POLICIES.get(policy).compare(cand, References(ref, ref.double()))
    assert not result.passed and "NaN pattern differs (1 NaN, expected 0)" in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_matching_nan_and_inf_patterns_pass(policy: str) -> None:
    ref = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    result = POLICIES.get(policy).compare(ref.clone(), References(ref, ref.double()))
    assert result.passed, result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_missing_nan_fails(policy: str) -> None:
    ref = torch.tensor([1.0, float("nan"), 3.0])
    result = POLICIES.get(policy).compare(torch.tensor([1.0, 0.0, 3.0]), References(ref, ref.double()))
    assert not result.passed and "NaN pattern differs (0 NaN, expected 1)" in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_inf_of_the_wrong_sign_fails(policy: str) -> None:
    ref = torch.tensor([1.0, float("inf")])
    result = POLICIES.get(policy).compare(torch.tensor([1.0, -float("inf")]), References(ref, ref.double()))
    assert not result.passed and "Inf pattern differs" in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_inf_where_the_reference_is_finite_fails(policy: str) -> None:
    ref = torch.tensor([1.0, 2.0])
    result = POLICIES.get(policy).compare(torch.tensor([1.0, float("inf")]), References(ref, ref.double()))
    assert not result.passed and "Inf pattern differs (1 Inf, expected 0)" in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_shape_mismatch_fails(policy: str) -> None:
    ref = torch.zeros(4, 3)
    result = POLICIES.get(policy).compare(torch.zeros(3, 4), References(ref, ref.double()))
    assert not result.passed and "shape (3, 4) != expected (4, 3)" in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_dtype_mismatch_fails(policy: str) -> None:
    ref = torch.zeros(4)
    result = POLICIES.get(policy).compare(torch.zeros(4, dtype=torch.float64), References(ref, ref.double()))
    assert not result.passed and "dtype torch.float64 != expected torch.float32" in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize(
    ("candidate", "reference", "fragment"),
    [
        ((torch.zeros(2),), (torch.zeros(2), torch.zeros(2)), "expected tuple of 2, got tuple of 1"),
        ([torch.zeros(2)], (torch.zeros(2),), "expected tuple of 1, got list of 1"),
        (torch.zeros(2), (torch.zeros(2),), "expected tuple of 1, got Tensor(2,)"),
        ({"a": torch.zeros(1)}, {"b": torch.zeros(1)}, "expected dict with keys ['b'], got dict with keys ['a']"),
        (3.0, torch.zeros(()), "expected Tensor(), got float"),
    ],
)
def test_structure_mismatch_fails_with_a_description(policy, candidate, reference, fragment) -> None:
    result = POLICIES.get(policy).compare(candidate, References(reference, reference))
    assert not result.passed and "output structure differs" in result.message and fragment in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_nested_outputs_report_the_failing_leaf_path(policy: str) -> None:
    ref = (torch.ones(3), {"y": torch.ones(2)})
    cand = (torch.ones(3), {"y": torch.tensor([1.0, 5.0])})
    result = POLICIES.get(policy).compare(cand, References(ref, tuple([ref[0].double(), {"y": ref[1]["y"].double()}])))
    assert not result.passed and result.message.startswith("output[1]['y']")


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_outputs_must_match_exactly(policy: str, dtype: torch.dtype) -> None:
    ref = torch.tensor([0, 1, 1, 0]).to(dtype)
    policy_obj = POLICIES.get(policy)
    assert policy_obj.compare(ref.clone(), References(ref, ref)).passed
    off = ref.clone()
    off[2] = 0
    result = policy_obj.compare(off, References(ref, ref))
    assert not result.passed and "1 of 4 integer/bool elements differ" in result.message


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_scalar_outputs_compare_by_value(policy: str) -> None:
    ref = (torch.ones(1), 3, float("nan"))
    policy_obj = POLICIES.get(policy)
    refs = References(ref, (torch.ones(1, dtype=torch.float64), 3, float("nan")))
    assert policy_obj.compare((torch.ones(1), 3, float("nan")), refs).passed
    result = policy_obj.compare((torch.ones(1), 4, float("nan")), refs)
    assert not result.passed and "value 4 != expected 3" in result.message


# -- allclose tolerances -----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("policy", "dtype", "tol"),
    [
        ("kernelbench", torch.float32, 1e-4),
        ("kernelbench", torch.float16, 1e-2),
        ("kernelbench", torch.bfloat16, 1e-2),
        ("cuda-agent", torch.float32, 1e-2),
        ("cuda-agent", torch.float16, 1e-2),
    ],
)
def test_allclose_policy_tolerance_boundary(policy: str, dtype: torch.dtype, tol: float) -> None:
    """|cand - ref| <= atol + rtol*|ref| with atol = rtol = tol: 0.8x the bound passes, 1.25x fails."""
    ref = torch.tensor([0.0, 0.5, -2.0, 8.0], dtype=dtype)
    bound = tol * (1 + ref.double().abs())
    refs = References(ref, ref.double())
    inside = (ref.double() + 0.8 * bound).to(dtype)
    outside = (ref.double() + 1.25 * bound).to(dtype)
    policy_obj = POLICIES.get(policy)
    assert policy_obj.compare(inside, refs).passed
    result = policy_obj.compare(outside, refs)
    assert not result.passed and f"atol=rtol={tol:g}" in result.message


def test_cuda_agent_tolerance_admits_tf32_level_error_that_kernelbench_rejects() -> None:
    a = torch.randn(64, 64, generator=generator(8))
    b = torch.randn(64, 64, generator=generator(9))
    refs = references(torch.matmul, a, b)
    tf32 = (round_to_tf32(a).double() @ round_to_tf32(b).double()).float()
    assert CUDA_AGENT.compare(tf32, refs).passed
    assert not KERNELBENCH.compare(tf32, refs).passed
    assert not FAITHFUL.compare(tf32, refs).passed


def test_allclose_ignores_elements_where_the_reference_is_not_finite() -> None:
    ref = torch.tensor([float("inf"), 1.0])
    result = KERNELBENCH.compare(torch.tensor([float("inf"), 1.00001]), References(ref, ref.double()))
    assert result.passed


def test_policy_baselines_follow_their_tf32_rule() -> None:
    assert POLICIES.get("faithful").baseline == "tf32_off"
    assert POLICIES.get("tf32").baseline == "tf32_on"
    assert KERNELBENCH.baseline == "fastest" and CUDA_AGENT.baseline == "fastest"
    assert POLICIES.get("faithful").needs_float64 and not KERNELBENCH.needs_float64
    assert POLICIES.get("tf32").needs_tf32_reference and not POLICIES.get("faithful").needs_tf32_reference


def test_tf32_policy_measures_against_the_tf32_reference_when_present() -> None:
    a = torch.randn(64, 128, generator=generator(10))
    b = torch.randn(128, 64, generator=generator(11))
    tf32_eager = (round_to_tf32(a).double() @ round_to_tf32(b).double()).float()
    refs = References(fp32=a @ b, fp64=a.double() @ b.double(), tf32=tf32_eager)
    assert POLICIES.get("tf32").compare(tf32_eager.clone(), refs).passed
    assert not POLICIES.get("faithful").compare(tf32_eager.clone(), refs).passed


def test_unknown_policy_lists_the_valid_names() -> None:
    expected = "unknown precision policy 'fp8'; valid: cuda-agent, faithful, kernelbench, tf32"
    with pytest.raises(KeyError, match=expected):
        POLICIES.get("fp8")


@pytest.mark.parametrize("policy", ["kernelbench", "cuda-agent"])
def test_allclose_rejects_zeros_for_an_output_tiny_next_to_atol(policy: str) -> None:
    x = torch.randn(4096, generator=generator())
    refs = References(fp32=x * 1e-6)
    zeros = POLICIES.get(policy).compare(torch.zeros(4096), refs)
    assert not zeros.passed and "atol capped" in zeros.message
    assert POLICIES.get(policy).compare((x.double() * 1e-6).float(), refs).passed


def test_a_reference_whose_float64_structure_differs_is_named() -> None:
    same = rounding_dependent_shape((torch.zeros(3, dtype=torch.float64), 2), (torch.zeros(3), 2))
    assert same is None
    assert rounding_dependent_shape([torch.zeros(2, dtype=torch.float64)], [torch.zeros(2), torch.zeros(1)]) == (
        "the reference returns 1 outputs computed in float64 and 2 in float32")
    assert rounding_dependent_shape({"a": torch.zeros(5, dtype=torch.float64)}, {"a": torch.zeros(4)}).startswith(
        "the reference's output['a'] has shape (5,) computed in float64 and (4,) in float32")

"""Comparing a candidate's outputs with the reference's: the numeric side of the precision policies.

Runs only in the trusted reference worker (and the calibration bench), on whatever device the
references live on: reductions over bounded chunks of each output (a 6 GB output is checked with a
few hundred MB of float64 temporaries), no copies to the host beyond a few scalars per output. :mod:`precision` holds the policies themselves (names, rules, tolerances); it needs no
torch, so the trusted parent that picks a policy never imports it.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import torch

if TYPE_CHECKING:
    from cuda_agent.environment.precision import AllclosePolicy, FaithfulPolicy, PrecisionPolicy


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


def compare(policy: "PrecisionPolicy", candidate: Any, refs: References) -> Comparison:
    """Check structure (same nesting, shapes, dtypes) and the non-finite pattern (NaN where the fp32
    reference has NaN, ±Inf with the same sign), then ``policy``'s numeric rule on every
    floating-point output; the first failing output decides."""
    with _one_host_thread():
        return _compare(policy, candidate, refs)


@contextlib.contextmanager
def _one_host_thread() -> Iterator[None]:
    """Host-side checks stream a chunk through a dozen cheap passes: with several intra-op threads
    each pass is a parallel region of a millisecond, and on a busy machine (the candidate's worker,
    builds) every region waits for a descheduled thread. Measured on a 2-core host under load, a
    1 GiB check took 63 s with two threads and 7 s with one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _compare(policy: "PrecisionPolicy", candidate: Any, refs: References) -> Comparison:
    if policy.rule == "faithful" and refs.fp64 is None:  # the reference cannot run in float64
        result = _compare(policy.fallback, candidate, refs)
        return Comparison(result.passed, result.message, result.max_abs_err, None, policy.fallback.name)
    leaves = _paired_leaves(candidate, refs.fp32)
    if isinstance(leaves, str):
        return Comparison(False, leaves)
    ref64_leaves = _flatten(refs.fp64) if refs.fp64 is not None else None
    tf32_leaves = _flatten(refs.tf32) if refs.tf32 is not None else None
    check_leaf = _faithful_leaf if policy.rule == "faithful" else _allclose_leaf
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
            mismatches = sum(int((c != r).sum()) for c, r in _chunks(cand, ref))
            if mismatches:
                return Comparison(False, f"output{path}: {mismatches} of {ref.numel()} integer/bool elements differ", worst_err)
            continue
        problem = _nonfinite_problem(path, cand, ref)
        if problem:
            return Comparison(False, problem, worst_err)
        leaf = check_leaf(policy, path, cand, ref, ref64_leaves[i][1] if ref64_leaves else None,
                          tf32_leaves[i][1] if tf32_leaves else None)
        worst_err = max(worst_err, leaf.max_abs_err)
        if leaf.error_ratio is not None:
            worst_ratio = max(worst_ratio or 0.0, leaf.error_ratio)
        if not leaf.passed:
            return Comparison(False, leaf.message, worst_err, worst_ratio)
    summary = f"max abs err {worst_err:.3g}" + (f", error ratio {worst_ratio:.3g}" if worst_ratio is not None else "")
    return Comparison(True, summary, worst_err, worst_ratio)


CHUNK_ELEMENTS = {"cuda": 1 << 24, "cpu": 1 << 20}
"""Elements compared at once: the float64 temporaries of a check stay a few hundred MB on a GPU
(and a few MB of host memory, which stay in cache) however large the output is."""


def _chunks(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Matching slices of the flattened ``tensors`` (same numel), a bounded number of elements at a time."""
    flat = [t.reshape(-1) for t in tensors]
    step = CHUNK_ELEMENTS["cuda" if flat[0].is_cuda else "cpu"]
    for start in range(0, flat[0].numel(), step):
        yield tuple(t[start:start + step] for t in flat)


def _abs_diff(a: torch.Tensor, b: torch.Tensor, unusable: torch.Tensor | None) -> torch.Tensor:
    """``|a - b|`` in float64 (``b`` is float64 or promotes ``a`` to it), 0 where ``unusable``
    (None: every place is usable)."""
    diff = torch.sub(a, b)
    if diff.dtype != torch.float64 and not diff.is_complex():
        diff = diff.double()
    diff = diff.abs() if diff.is_complex() else diff.abs_()
    return diff.masked_fill_(unusable, 0.0) if unusable is not None else diff


def _allclose_leaf(policy: "AllclosePolicy", path: str, cand: torch.Tensor, ref32: torch.Tensor,
                   ref64: torch.Tensor | None, ref_tf32: torch.Tensor | None) -> _LeafResult:
    """``|cand - ref| <= atol + rtol * |ref|`` elementwise against the fp32 reference, atol capped
    at ``policy.tiny_output_atol_share`` of the output's largest magnitude."""
    tol = policy.tolerance(str(ref32.dtype).removeprefix("torch."))
    # [finite elements, largest finite magnitude]; then [elements outside the tolerance, max error]
    found = torch.zeros(2, dtype=torch.float64, device=ref32.device)
    for (r,) in _chunks(ref32):
        finite = torch.isfinite(r)
        magnitude = _abs_diff(r, torch.zeros((), dtype=torch.float64, device=r.device), ~finite)
        found[0] += finite.sum()
        found[1] = torch.maximum(found[1], magnitude.max())
    count, largest = found.tolist()
    if count == 0:
        return _LeafResult(True, "no finite elements", 0.0)
    atol = min(tol, policy.tiny_output_atol_share * largest)
    outside = torch.zeros(2, dtype=torch.float64, device=ref32.device)
    for r, c in _chunks(ref32, cand):
        unusable = ~torch.isfinite(r)  # the non-finite places matched already
        unusable = unusable if bool(unusable.any()) else None
        diff = _abs_diff(c, r.double(), unusable)
        bound = _abs_diff(r, torch.zeros((), dtype=torch.float64, device=r.device), unusable).mul_(tol).add_(atol)
        outside[0] += (diff > bound).sum()
        outside[1] = torch.maximum(outside[1], diff.max())
    bad, max_err = outside.tolist()
    if bad:
        capped = f" (atol capped at {atol:.3g}: the output is tiny next to the tolerance)" if atol < tol else ""
        return _LeafResult(False, f"output{path}: {int(bad)} of {int(count)} elements outside "
                           f"atol=rtol={tol:g}{capped} (max abs err {max_err:.3g})", max_err)
    return _LeafResult(True, "", max_err)


def _faithful_leaf(policy: "FaithfulPolicy", path: str, cand: torch.Tensor, ref32: torch.Tensor,
                   ref64: torch.Tensor, ref_tf32: torch.Tensor | None) -> _LeafResult:
    """Candidate error against float64 within ``error_ratio_limit`` times the eager reference's own
    error plus a floor of ``ulp_floor`` fp32 epsilons relative to the output, in L2 and max norm."""
    eager = ref_tf32 if (policy.needs_tf32_reference and ref_tf32 is not None) else ref32
    # Sums of squares and maxima of the candidate's error, eager's error and the output's magnitude
    # over the places where eager and float64 are finite, accumulated on the device chunk by chunk.
    totals = torch.zeros(7, dtype=torch.float64, device=ref32.device)
    zero = torch.zeros((), dtype=ref64.dtype, device=ref64.device)
    for e, exact, c in _chunks(eager, ref64, cand):
        unusable = ~(torch.isfinite(e) & torch.isfinite(exact))
        totals[6] += unusable.numel() - unusable.sum()
        unusable = unusable if bool(unusable.any()) else None
        for slot, error in enumerate((_abs_diff(c, exact, unusable), _abs_diff(e, exact, unusable),
                                      _abs_diff(exact, zero, unusable))):
            totals[slot] += torch.dot(error, error)
            totals[3 + slot] = torch.maximum(totals[3 + slot], error.max())
    sq_cand, sq_eager, sq_scale, max_cand, max_eager, max_scale, finite_count = totals.tolist()
    if finite_count == 0:
        return _LeafResult(True, "no finite elements", 0.0)
    l2_cand, l2_eager, l2_scale = math.sqrt(sq_cand), math.sqrt(sq_eager), math.sqrt(sq_scale)
    eps = torch.finfo(ref32.dtype).eps
    k, floor = policy.error_ratio_limit, policy.ulp_floor * eps
    l2_tol = k * l2_eager + floor * l2_scale
    max_tol = k * max_eager + floor * max_scale
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


def rounding_dependent_shape(exact: Any, single: Any) -> str | None:
    """Why the float64 reference ``exact`` and the float32 one ``single`` differ in structure
    (the number of outputs, or a tensor's shape), else None. An output whose shape depends on
    rounding (``unique`` of floats, ``nonzero`` of a difference) cannot be judged: which shape a
    candidate's has is as much a matter of its summation order as of being right."""
    exact_leaves, single_leaves = _flatten(exact), _flatten(single)
    if len(exact_leaves) != len(single_leaves):
        return (f"the reference returns {len(exact_leaves)} outputs computed in float64 and "
                f"{len(single_leaves)} in float32")
    for (path, wide), (_, narrow) in zip(exact_leaves, single_leaves):
        if isinstance(wide, torch.Tensor) and isinstance(narrow, torch.Tensor) and wide.shape != narrow.shape:
            return (f"the reference's output{path} has shape {tuple(wide.shape)} computed in float64 and "
                    f"{tuple(narrow.shape)} in float32: its shape depends on rounding, so no candidate's "
                    "output can be judged against it")
    return None


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
    # [NaN places differing, candidate NaN, reference NaN, Inf places or signs differing, candidate Inf, reference Inf]
    counts = torch.zeros(6, dtype=torch.int64, device=ref.device)
    for c, r in _chunks(cand, ref):
        if bool(torch.isfinite(r).all() & torch.isfinite(c).all()):  # the usual case: one pass each
            continue
        ref_nan, cand_nan = torch.isnan(r), torch.isnan(c)
        counts[:3] += torch.stack([(ref_nan != cand_nan).sum(), cand_nan.sum(), ref_nan.sum()])
        if not ref.is_complex():
            ref_inf, cand_inf = torch.isinf(r), torch.isinf(c)
            sign_differs = ref_inf & cand_inf & (torch.sign(r) != torch.sign(c))
            counts[3:] += torch.stack([((ref_inf != cand_inf) | sign_differs).sum(), cand_inf.sum(), ref_inf.sum()])
    nan_differ, cand_nan_n, ref_nan_n, inf_differ, cand_inf_n, ref_inf_n = counts.tolist()
    if nan_differ:
        return f"output{path}: NaN pattern differs ({cand_nan_n} NaN, expected {ref_nan_n})"
    if inf_differ:
        return f"output{path}: Inf pattern differs ({cand_inf_n} Inf, expected {ref_inf_n})"
    return None

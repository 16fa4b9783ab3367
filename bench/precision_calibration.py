"""Calibrate the ``faithful`` precision policy: honest fp32 kernels against fp16/bf16/TF32 downcasts.

For each operation, shape and input distribution this computes a float64 reference, the fp32 eager
reference (TF32 off) and a set of emulated candidate kernels, then the ratio of each candidate's
error (against float64) to the eager reference's own error, in the L2 and the max norm, and asks
the real ``faithful`` policy whether it passes the candidate.

Candidates:

- honest fp32 kernels that differ from eager only in summation order or in a stable fp32
  algorithm: sequential, reversed, sequential with FMA, pairwise tree, split-K (fp32 partials),
  Kahan, float64 accumulation rounded to fp32 (the most accurate honest kernel), and per operation
  a few common fp32 variants (online softmax, exp2-based "fast" exp, Welford variance, rsqrt with a
  2-ulp error);
- "unstable": fp32 algorithms known to cancel catastrophically (one-pass variance E[x^2]-E[x]^2),
  reported but not used to calibrate;
- downcasts: fp16 or bf16 operands with fp32 accumulation, TF32 operands (mantissa rounded to
  10 bits, round-to-nearest-even, then fp32 math; matmul and conv only, where TF32 applies; on CUDA
  also the real TF32 tensor-core path, reported as kind "no_tf32" and not calibrated when the
  library picks a non-TF32 algorithm and the result equals eager's), and fp16 operands with fp16
  accumulation (pairwise tree, the most lenient fp16 order).

Input distributions: randn and randn x4 (sign-symmetric), rand (all-positive), and for layernorm
randn + 1024 ("offset": the mean subtraction cancels ~10 bits, so the ulp floor cannot help and
the error-ratio limit alone must admit honest kernels).

Sequential summations are emulated with an explicit fp32 loop over the reduction dimension:
``torch.cumsum`` is no substitute (on CPU it accumulates fp32 in double; on CUDA it is a parallel
scan), so the loop rounds every partial sum exactly as a one-thread kernel would.

The decisive number of a case is ``ratio = max(ratio_l2, ratio_max)``: ignoring the ulp floor the
policy passes a candidate exactly when ``ratio <= K``. ``k_needed`` also accounts for the floor: the
smallest K at which the policy would pass the candidate. Calibration wants every honest kernel (on
every distribution) to pass and every downcast on sign-symmetric inputs to fail; the script also
searches (K, floor) for the pair with the widest worst-case log2 margin over those constraints.

    python bench/precision_calibration.py --device cpu --out bench/results/precision_calibration_cpu.json
    python bench/precision_calibration.py --device cuda --out bench/results/precision_calibration_cuda.json
    python bench/precision_calibration.py --quick          # CI-sized, < 60 s on 2 CPU cores
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from cuda_agent.environment import precision
from cuda_agent.environment.comparison import References, tf32_enabled
from cuda_agent.environment.precision import POLICIES

EPS32 = torch.finfo(torch.float32).eps
LOG2E = 1.4426950408889634
SIGN_SYMMETRIC = ("randn", "randn_x4")
DISTRIBUTIONS = ("randn", "rand", "randn_x4")
OFFSET = 1024.0  # "offset" inputs, randn + OFFSET: layernorm's mean subtraction cancels ~10 bits


# ------------------------------------------------------------------------------------------------
# Rounding helpers
# ------------------------------------------------------------------------------------------------
def round_fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(x.dtype)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to TF32 (10 explicit mantissa bits), round-to-nearest-even, kept as fp32."""
    bits = x.contiguous().view(torch.int32)
    lsb = torch.bitwise_and(torch.bitwise_right_shift(bits, 13), 1)
    rounded = torch.bitwise_and(bits + 0xFFF + lsb, ~0x1FFF)
    return rounded.view(torch.float32)


def on_host(emulation: Callable) -> Callable:
    """Run a step-by-step emulation (one fp32 operation per reduction element) on the CPU and hand
    its tensors back on the inputs' device. On a GPU every step is a kernel launch: one 16x1048576
    sequential row sum took 58 s on an H200. IEEE fp32 add, multiply, divide and max round alike on
    both; the online softmax's ``exp`` comes from the host's math library (within an ulp or two of
    CUDA's ``expf``)."""

    @functools.wraps(emulation)
    def run(*args):
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        if device.type == "cpu":
            return emulation(*args)
        result = emulation(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
        return tuple(r.to(device) for r in result) if isinstance(result, tuple) else result.to(device)

    return run


# ------------------------------------------------------------------------------------------------
# Summation orders. Each takes terms of shape (K, *batch) and sums over dim 0, rounding every
# partial result to the terms' dtype (fp32, or fp16 for fp16 accumulation).
# ------------------------------------------------------------------------------------------------
@on_host
def sum_sequential(t: torch.Tensor) -> torch.Tensor:
    acc = t[0].clone()
    for k in range(1, t.shape[0]):
        acc.add_(t[k])
    return acc


def sum_pairwise(t: torch.Tensor) -> torch.Tensor:
    while t.shape[0] > 1:
        n = t.shape[0]
        if n % 2:
            t = torch.cat([t[0:n - 1:2] + t[1:n:2], t[n - 1:]])
        else:
            t = t[0::2] + t[1::2]
    return t[0]


def _lanes(t: torch.Tensor, lanes: int) -> torch.Tensor:
    """(K, *b) -> (ceil(K/lanes), lanes, *b): lane j holds the j-th contiguous chunk of K (zero-padded)."""
    k = t.shape[0]
    chunk = -(-k // lanes)
    if chunk * lanes != k:
        t = torch.cat([t, t.new_zeros((chunk * lanes - k, *t.shape[1:]))])
    return t.reshape(lanes, chunk, *t.shape[1:]).transpose(0, 1).contiguous()


def sum_split_k(t: torch.Tensor) -> torch.Tensor:
    """Split-K: up to 32 contiguous chunks, each summed sequentially, partials summed sequentially."""
    splits = max(1, min(32, t.shape[0] // 16))
    return sum_sequential(sum_sequential(_lanes(t, splits)))


@on_host
def _kahan(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s, c = torch.zeros_like(t[0]), torch.zeros_like(t[0])
    for k in range(t.shape[0]):
        y = t[k] - c
        total = s + y
        c = (total - s) - y
        s = total
    return s, c


def sum_kahan(t: torch.Tensor) -> torch.Tensor:
    """Kahan-compensated summation. Long reductions run as <=4096-step compensated lanes whose sums
    and compensations are combined by a final Kahan pass (keeps the Python loop short)."""
    lanes = max(1, -(-t.shape[0] // 4096))
    s, c = _kahan(_lanes(t, lanes))
    if lanes == 1:
        return s[0]
    return _kahan(torch.cat([s, -c]))[0]


ORDERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sequential": sum_sequential,
    "reversed": lambda t: sum_sequential(t.flip(0)),
    "pairwise": sum_pairwise,
    "split_k": sum_split_k,
    "kahan": sum_kahan,
}

HONEST_ORDERS = ["sequential", "reversed", "sequential_fma", "pairwise", "split_k", "kahan", "fp64_accumulate"]


def reduce(a: torch.Tensor, b: torch.Tensor | None, how: str) -> torch.Tensor:
    """Sum over dim 0 of ``a * b`` (or of ``a``), both broadcastable to (K, *batch), as kernel ``how``.

    Products are rounded to fp32 before they are added (no FMA), except in ``sequential_fma`` and
    ``fp64_accumulate``, whose products are exact.
    """
    if how == "fp64_accumulate":
        terms = a.double() * b.double() if b is not None else a.double()
        return terms.sum(0).float()
    if how == "sequential_fma":
        if b is None:
            return sum_sequential(a.contiguous())
        return _fma_sequential(a.double(), b.double())
    if how == "fp16_accumulate":  # operands already fp16-rounded; products and partials rounded to fp16
        terms = round_fp16(a * b) if b is not None else a
        return sum_pairwise(terms.half().contiguous()).float()
    terms = a * b if b is not None else a
    return ORDERS[how](terms.contiguous())


@on_host
def _fma_sequential(a64: torch.Tensor, b64: torch.Tensor) -> torch.Tensor:
    acc = (a64[0] * b64[0]).float()
    for k in range(1, a64.shape[0]):
        acc = (acc.double() + a64[k] * b64[k]).float()  # one rounding per step, as an FMA
    return acc


# ------------------------------------------------------------------------------------------------
# Operations
# ------------------------------------------------------------------------------------------------
@dataclass
class Op:
    """One operation at one shape. ``eager`` works in the inputs' dtype (fp32 or float64)."""

    name: str
    shape: str
    reduction: int  # length of the reduction (K)
    make: Callable[[torch.Generator, str, str], list[torch.Tensor]]
    eager: Callable[..., torch.Tensor]
    emulate: Callable[..., torch.Tensor]  # (inputs..., how=variant, gen=...) -> fp32 output
    extra_honest: list[str] = field(default_factory=list)
    tensor_core: bool = False  # TF32 applies (matmul / conv)
    products: bool = True  # the reduction sums products (FMA is a distinct kernel)
    unstable: list[str] = field(default_factory=list)  # fp32 algorithms known to lose accuracy (reported only)
    dists: tuple[str, ...] = DISTRIBUTIONS

    def honest_variants(self) -> list[str]:
        return [v for v in HONEST_ORDERS if self.products or v != "sequential_fma"] + self.extra_honest

    def downcast_variants(self, device: str) -> list[str]:
        names = ["fp16_operands", "bf16_operands"]
        if self.tensor_core:
            names.append("tf32_operands")
            if device == "cuda":
                names.append("tf32_hardware")
        return names + ["fp16_accumulate"]


def _draw(gen: torch.Generator, dist: str, shape: tuple[int, ...], device: str) -> torch.Tensor:
    if dist == "rand":
        x = torch.rand(shape, generator=gen, dtype=torch.float32)
    elif dist == "offset":
        x = torch.randn(shape, generator=gen, dtype=torch.float32) + OFFSET
    else:
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        if dist == "randn_x4":
            x = x * 4
    return x.to(device)


def op_matmul(m: int, k: int, n: int) -> Op:
    def make(gen, dist, device):
        return [_draw(gen, dist, (m, k), device), _draw(gen, dist, (k, n), device)]

    def emulate(a, b, how, gen):
        return reduce(a.t()[:, :, None], b[:, None, :], how)

    return Op("matmul", f"{m}x{k} @ {k}x{n}", k, make, torch.matmul, emulate, tensor_core=True)


def op_rowsum(rows: int, n: int) -> Op:
    def make(gen, dist, device):
        return [_draw(gen, dist, (rows, n), device)]

    def emulate(x, how, gen):
        return reduce(x.t(), None, how)

    return Op("row_sum", f"{rows}x{n}", n, make, lambda x: x.sum(-1), emulate, products=False)


def op_softmax(rows: int, n: int) -> Op:
    def make(gen, dist, device):
        return [_draw(gen, dist, (rows, n), device)]

    def emulate(x, how, gen):
        if how == "online":
            m, s = _online_max_and_sum(x.t().contiguous())
            return torch.exp(x - m[:, None]) / s[:, None]
        m = x.max(-1, keepdim=True).values
        if how == "fast_exp":  # exp(x - m) as exp2(x*log2e - m*log2e): the fused-scale trick of fast kernels
            e = torch.exp2(x * LOG2E - m * LOG2E)
            return e / sum_pairwise(e.t().contiguous())[:, None]
        if how == "fp16_accumulate":
            e = round_fp16(torch.exp(x - m))
            return e / reduce(e.t(), None, how)[:, None]
        e = torch.exp(x - m)
        return e / reduce(e.t(), None, how)[:, None]

    return Op("softmax", f"{rows}x{n}", n, make, lambda x: torch.softmax(x, -1), emulate,
              extra_honest=["online", "fast_exp"], products=False)


@on_host
def _online_max_and_sum(xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over (n, rows): running max, running sum rescaled whenever the max grows."""
    m, s = xt[0].clone(), torch.ones_like(xt[0])
    for k in range(1, xt.shape[0]):
        m_new = torch.maximum(m, xt[k])
        s = s * torch.exp(m - m_new) + torch.exp(xt[k] - m_new)
        m = m_new
    return m, s


@on_host
def _welford(xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Welford's running mean and sum of squared deviations over (n, rows)."""
    mean, m2 = torch.zeros_like(xt[0]), torch.zeros_like(xt[0])
    for k in range(xt.shape[0]):
        delta = xt[k] - mean
        mean = mean + delta / (k + 1)
        m2 = m2 + delta * (xt[k] - mean)
    return mean, m2


def _perturb_rsqrt(r: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """An rsqrt off by 2 ulp (CUDA ``rsqrtf``'s documented maximum), sign at random per row."""
    sign = torch.randint(0, 2, r.shape, generator=gen).to(r.device, r.dtype) * 2 - 1
    return r * (1 + 2 * EPS32 * sign)


LN_EPS = 1e-5


def op_layernorm(rows: int, n: int) -> Op:
    def make(gen, dist, device):
        return [_draw(gen, dist, (rows, n), device)]

    def eager(x):
        return F.layer_norm(x, (n,), eps=LN_EPS)

    def emulate(x, how, gen):
        if how == "welford":
            mean, m2 = _welford(x.t().contiguous())
            return (x - mean[:, None]) * torch.rsqrt(m2 / n + LN_EPS)[:, None]
        if how == "one_pass":  # var = E[x^2] - E[x]^2 (pairwise sums)
            mean = reduce(x.t(), None, "pairwise") / n
            var = (reduce(x.t(), x.t(), "pairwise") / n - mean * mean).clamp_min(0)
            return (x - mean[:, None]) * torch.rsqrt(var + LN_EPS)[:, None]
        order = "pairwise" if how == "fast_rsqrt" else how
        if how == "fp16_accumulate":
            mean = round_fp16(reduce(x.t(), None, how) / n)
            d = round_fp16(x - mean[:, None])
            var = round_fp16(reduce(d.t(), d.t(), how) / n)
        else:
            mean = reduce(x.t(), None, order) / n
            d = x - mean[:, None]
            var = reduce(d.t(), d.t(), order) / n
        rstd = torch.rsqrt(var + LN_EPS)
        if how == "fast_rsqrt":
            rstd = _perturb_rsqrt(rstd, gen)
        return d * rstd[:, None]

    return Op("layernorm", f"{rows}x{n}", n, make, eager, emulate, extra_honest=["welford", "fast_rsqrt"],
              unstable=["one_pass"], dists=DISTRIBUTIONS + ("offset",))


def op_rmsnorm(rows: int, n: int) -> Op:
    def make(gen, dist, device):
        return [_draw(gen, dist, (rows, n), device)]

    def eager(x):  # as a KernelBench-style task writes it
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LN_EPS)

    def emulate(x, how, gen):
        order = "pairwise" if how == "fast_rsqrt" else how
        rstd = torch.rsqrt(reduce(x.t(), x.t(), order) / n + LN_EPS)
        if how == "fast_rsqrt":
            rstd = _perturb_rsqrt(rstd, gen)
        return x * rstd[:, None]

    return Op("rmsnorm", f"{rows}x{n}", n, make, eager, emulate, extra_honest=["fast_rsqrt"])


def op_conv3x3(batch: int, cin: int, cout: int, hw: int) -> Op:
    def make(gen, dist, device):
        return [_draw(gen, dist, (batch, cin, hw, hw), device), _draw(gen, dist, (cout, cin, 3, 3), device)]

    def eager(x, w):
        return F.conv2d(x, w, padding=1)

    def emulate(x, w, how, gen):  # im2col: K = cin * 9
        cols = F.unfold(x, 3, padding=1)  # (batch, cin*9, hw*hw), an exact copy
        a = w.reshape(cout, cin * 9).t()[:, None, :, None]
        b = cols.permute(1, 0, 2)[:, :, None, :]
        return reduce(a, b, how).reshape(batch, cout, hw, hw)

    return Op("conv3x3", f"{batch}x{cin}x{hw}x{hw} * {cout}x{cin}x3x3", cin * 9, make, eager, emulate,
              tensor_core=True)


def build_ops(quick: bool) -> list[Op]:
    if quick:
        return [
            op_matmul(32, 64, 32), op_matmul(16, 512, 16), op_matmul(8, 4096, 8), op_matmul(4, 65536, 4),
            op_rowsum(16, 4096), op_rowsum(16, 65536),
            op_softmax(16, 1024), op_layernorm(16, 1024), op_rmsnorm(16, 1024),
            op_conv3x3(1, 16, 8, 8),
        ]
    return [
        op_matmul(128, 64, 128), op_matmul(64, 512, 64), op_matmul(32, 4096, 32), op_matmul(16, 65536, 16),
        op_matmul(8, 65536, 8),  # small enough that CPU eager matmul is itself a sequential loop
        op_rowsum(64, 4096), op_rowsum(16, 1 << 20),
        op_softmax(64, 4096), op_layernorm(64, 4096), op_rmsnorm(64, 4096),
        op_conv3x3(2, 64, 16, 16),
    ]


# ------------------------------------------------------------------------------------------------
# Candidates and measurements
# ------------------------------------------------------------------------------------------------
def candidate(op: Op, inputs: list[torch.Tensor], variant: str, gen: torch.Generator) -> torch.Tensor:
    with torch.no_grad(), tf32_enabled(variant == "tf32_hardware"):
        if variant == "fp16_operands":
            return op.eager(*[round_fp16(x) for x in inputs])
        if variant == "bf16_operands":
            return op.eager(*[round_bf16(x) for x in inputs])
        if variant == "tf32_operands":
            return op.eager(*[round_tf32(x) for x in inputs])
        if variant == "tf32_hardware":
            return op.eager(*inputs)
        if variant == "fp16_accumulate":
            return op.emulate(*[round_fp16(x) for x in inputs], how=variant, gen=gen)
        return op.emulate(*inputs, how=variant, gen=gen)


def norms(cand: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor) -> dict[str, float]:
    """The policy's own quantities over the finite references: the candidate's and the eager
    reference's errors against float64, and the size of the float64 result, in L2 and max norm."""
    finite = torch.isfinite(eager) & torch.isfinite(exact)
    c, e, x = cand[finite].double(), eager[finite].double(), exact[finite].double()
    if not bool(torch.isfinite(c).all()):  # the policy's NaN/Inf-pattern check fails it outright
        cand_l2 = cand_max = math.inf
    else:
        cand_l2, cand_max = float(torch.linalg.vector_norm(c - x)), float((c - x).abs().max())
    return {
        "cand_l2": cand_l2, "eager_l2": float(torch.linalg.vector_norm(e - x)), "ref_l2": float(torch.linalg.vector_norm(x)),
        "cand_max": cand_max, "eager_max": float((e - x).abs().max()), "ref_max": float(x.abs().max()),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (0.0 if a == 0 else math.inf)


def k_needed(n: dict[str, float], floor: float) -> float:
    """Smallest error-ratio limit at which the policy (with this ulp floor) passes the candidate."""
    return max(_ratio(max(0.0, n[f"cand_{m}"] - floor * EPS32 * n[f"ref_{m}"]), n[f"eager_{m}"]) for m in ("l2", "max"))


def log2_margin(n: dict[str, float], honest: bool, k: float, floor: float) -> float:
    """How far (log2) a case is on the right side of the policy's line: for an honest kernel the
    tolerance over the error in its tighter norm, for a downcast the error over the tolerance in its
    looser norm. Negative means the policy gets the case wrong."""
    logs = []
    for m in ("l2", "max"):
        tol, err = k * n[f"eager_{m}"] + floor * EPS32 * n[f"ref_{m}"], n[f"cand_{m}"]
        if err == 0 or math.isinf(err):
            logs.append(math.inf if (err == 0) == honest else -math.inf)
        elif tol == 0:
            logs.append(-math.inf if honest else math.inf)
        else:
            logs.append(math.log2(tol / err) if honest else math.log2(err / tol))
    return min(logs) if honest else max(logs)


def run_case(op: Op, dist: str, seeds: int, device: str, floor: float, policy) -> list[dict]:
    per_variant: dict[str, list[dict]] = {}
    kinds = ({v: "honest" for v in op.honest_variants()} | {v: "unstable" for v in op.unstable}
             | {v: "downcast" for v in op.downcast_variants(device)})
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(1000 * seed + 17)
        inputs = op.make(gen, dist, device)
        with torch.no_grad(), tf32_enabled(False):
            eager = op.eager(*inputs)
            exact = op.eager(*[x.double() for x in inputs])
        refs = References(fp32=eager.cpu(), fp64=exact.cpu())
        for variant in kinds:
            cand = candidate(op, inputs, variant, gen)
            n = norms(cand, eager, exact)
            n["passed"] = policy.compare(cand.cpu(), refs).passed
            n["same_as_eager"] = bool(torch.equal(cand, eager))
            per_variant.setdefault(variant, []).append(n)
    rows = []
    for variant, runs in per_variant.items():
        kind = kinds[variant]
        if variant == "tf32_hardware" and all(n["same_as_eager"] for n in runs):
            kind = "no_tf32"  # the library chose a non-TF32 algorithm: an fp32 result, not a downcast
        pick = min if kind == "downcast" else max  # worst case for the policy
        r_l2 = [_ratio(n["cand_l2"], n["eager_l2"]) for n in runs]
        r_max = [_ratio(n["cand_max"], n["eager_max"]) for n in runs]
        rows.append({
            "op": op.name, "shape": op.shape, "reduction": op.reduction, "dist": dist,
            "sign_symmetric": dist in SIGN_SYMMETRIC, "variant": variant, "kind": kind,
            "ratio_l2": pick(r_l2), "ratio_max": pick(r_max), "ratio": pick(map(max, r_l2, r_max)),
            "k_needed": pick(k_needed(n, floor) for n in runs),
            "rel_err_l2": pick(_ratio(n["cand_l2"], n["ref_l2"]) for n in runs),
            "eager_rel_err_l2": max(_ratio(n["eager_l2"], n["ref_l2"]) for n in runs),
            "passed_seeds": sum(n["passed"] for n in runs), "seeds": len(runs),
            "runs": [{k: v for k, v in n.items() if k not in ("passed", "same_as_eager")} for n in runs],
        })
    return rows


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}" if x < 1e4 else f"{x:.2e}"


def _case(r: dict) -> str:
    return f"{r['op']} {r['shape']} {r['dist']} {r['variant']}"


def _constrained(rows: list[dict]) -> list[tuple[dict, dict, bool]]:
    """(row, run, honest) for every run the calibration constrains: honest kernels on every
    distribution must pass; downcasts on sign-symmetric inputs must fail."""
    out = []
    for r in rows:
        if r["kind"] == "honest" or (r["kind"] == "downcast" and r["sign_symmetric"]):
            out += [(r, n, r["kind"] == "honest") for n in r["runs"]]
    return out


def margin_at(rows: list[dict], k: float, floor: float) -> dict:
    """Worst log2 margin over the constrained runs at (k, floor), per side, with the binding cases."""
    worst = {True: (math.inf, ""), False: (math.inf, "")}
    for r, n, honest in _constrained(rows):
        m = log2_margin(n, honest, k, floor)
        if m < worst[honest][0]:
            worst[honest] = (m, _case(r))
    return {"error_ratio_limit": k, "ulp_floor": floor, "log2_margin": min(worst[True][0], worst[False][0]),
            "margin_factor": 2.0 ** min(worst[True][0], worst[False][0]),
            "honest_log2_margin": worst[True][0], "binding_honest": worst[True][1],
            "downcast_log2_margin": worst[False][0], "binding_downcast": worst[False][1]}


def search_constants(rows: list[dict]) -> dict:
    """The (error-ratio limit, ulp floor) pair with the widest worst-case log2 margin, on a grid of
    powers of two (the constants a human would pick) and on a finer grid (quarter powers)."""
    def best(ks, floors):
        top = None
        for k in ks:
            for f in floors:
                m = margin_at(rows, k, f)
                if top is None or m["log2_margin"] > top["log2_margin"] + 1e-12:
                    top = m
        return top

    return {
        "powers_of_two": best([2.0 ** i for i in range(0, 13)], [0.0] + [2.0 ** j for j in range(0, 14)]),
        "quarter_powers": best([2.0 ** (i / 4) for i in range(0, 49)], [0.0] + [2.0 ** (j / 4) for j in range(0, 53)]),
    }


def summarize(rows: list[dict], k_limit: float, floor: float) -> dict:
    honest = [r for r in rows if r["kind"] == "honest"]
    down_sym = [r for r in rows if r["kind"] == "downcast" and r["sign_symmetric"]]
    down_pos = [r for r in rows if r["kind"] == "downcast" and not r["sign_symmetric"]]
    worst_h = max(honest, key=lambda r: r["ratio"])
    best_d = min(down_sym, key=lambda r: r["ratio"])
    worst_h_k = max(honest, key=lambda r: r["k_needed"])
    best_d_k = min(down_sym, key=lambda r: r["k_needed"])
    return {
        "honest_worst_ratio": worst_h["ratio"], "honest_worst_case": _case(worst_h),
        "honest_all_pass": all(r["passed_seeds"] == r["seeds"] for r in honest),
        "honest_failing": [_case(r) for r in honest if r["passed_seeds"] < r["seeds"]],
        "downcast_sym_best_ratio": best_d["ratio"], "downcast_sym_best_case": _case(best_d),
        "downcast_sym_all_fail": all(r["passed_seeds"] == 0 for r in down_sym),
        "downcast_sym_passing": [_case(r) for r in down_sym if r["passed_seeds"] > 0],
        "raw_ratio_margin": _ratio(best_d["ratio"], worst_h["ratio"]),
        "margin": _ratio(best_d_k["k_needed"], worst_h_k["k_needed"]),  # net of the ulp floor
        "honest_max_k_needed": worst_h_k["k_needed"], "honest_max_k_needed_case": _case(worst_h_k),
        "downcast_sym_min_k_needed": best_d_k["k_needed"], "downcast_sym_min_k_needed_case": _case(best_d_k),
        "current_constants": margin_at(rows, k_limit, floor),
        "downcast_all_positive_passing": [_case(r) for r in down_pos if r["passed_seeds"] > 0],
        "tf32_hardware_not_engaged": [_case(r) for r in rows if r["kind"] == "no_tf32"],
        "search": search_constants(rows),
    }


def summary_line(s: dict) -> str:
    """The one-line verdict. Ratios are net of the ulp floor (``k_needed``: the error-ratio limit a
    case needs to pass), since that is what the policy compares with its limit; raw ratios follow."""
    yes = {True: "yes", False: "no"}
    x, y = s["honest_max_k_needed"], s["downcast_sym_min_k_needed"]
    return (f"honest: worst ratio {_fmt(x)} (all pass: {yes[s['honest_all_pass']]}); "
            f"downcasts on sign-symmetric inputs: best ratio {_fmt(y)} "
            f"(all fail: {yes[s['downcast_sym_all_fail']]}); margin {_fmt(_ratio(y, x))} "
            f"[ratios net of the ulp floor; raw ratios: honest {_fmt(s['honest_worst_ratio'])}, "
            f"downcasts {_fmt(s['downcast_sym_best_ratio'])}]")


def markdown_table(rows: list[dict]) -> str:
    """Per operation, shape and distribution: the worst honest kernel and the best-hidden downcast."""
    lines = ["| op | shape | inputs | worst honest (ratio L2 / max, k_needed) | passes | "
             "best-hidden downcast (ratio L2 / max, k_needed) | fails |",
             "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["shape"], r["dist"]), []).append(r)
    for (op, shape, dist), rs in groups.items():
        h = max((r for r in rs if r["kind"] == "honest"), key=lambda r: r["k_needed"])
        d = min((r for r in rs if r["kind"] == "downcast"), key=lambda r: r["k_needed"])
        fails = all(r["passed_seeds"] == 0 for r in rs if r["kind"] == "downcast")
        lines.append(
            f"| {op} | {shape} | {dist} | {h['variant']} {_fmt(h['ratio_l2'])} / {_fmt(h['ratio_max'])}, "
            f"{_fmt(h['k_needed'])} | {'yes' if all(r['passed_seeds'] == r['seeds'] for r in rs if r['kind'] == 'honest') else 'NO'} | "
            f"{d['variant']} {_fmt(d['ratio_l2'])} / {_fmt(d['ratio_max'])}, {_fmt(d['k_needed'])} | "
            f"{'all' if fails else 'NOT all'} |")
    return "\n".join(lines)


def print_table(rows: list[dict]) -> None:
    header = f"{'op':<9} {'shape':<28} {'dist':<8} {'kind':<8} {'variant':<16} {'ratio_l2':>9} {'ratio_max':>9} {'k_need':>9} {'rel_l2':>9}  pass"
    print(header)
    print("-" * len(header))
    last = None
    for r in rows:
        key = (r["op"], r["shape"], r["dist"])
        if last is not None and key != last:
            print()
        last = key
        print(f"{r['op']:<9} {r['shape']:<28} {r['dist']:<8} {r['kind']:<8} {r['variant']:<16} "
              f"{_fmt(r['ratio_l2']):>9} {_fmt(r['ratio_max']):>9} {_fmt(r['k_needed']):>9} "
              f"{_fmt(r['rel_err_l2']):>9}  {r['passed_seeds']}/{r['seeds']}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str) -> dict:
    info = {
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_model(),
    }
    if device == "cuda":
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--quick", action="store_true", help="small CI-sized run (< 60 s on 2 CPU cores)")
    parser.add_argument("--seeds", type=int, help="input draws per case (default 3, 1 with --quick)")
    parser.add_argument("--markdown", action="store_true", help="also print a condensed Markdown table (docs/precision.md)")
    parser.add_argument("--ops", help="comma-separated subset of operations (matmul,row_sum,softmax,layernorm,rmsnorm,conv3x3)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    seeds = args.seeds or (1 if args.quick else 3)
    policy = POLICIES.get("faithful")
    k_limit, floor = policy.error_ratio_limit, policy.ulp_floor

    ops = build_ops(args.quick)
    if args.ops:
        wanted = set(args.ops.split(","))
        ops = [op for op in ops if op.name in wanted]
    started = time.perf_counter()
    rows: list[dict] = []
    for op in ops:
        for dist in op.dists:
            t0 = time.perf_counter()
            rows += run_case(op, dist, seeds, args.device, floor, policy)
            print(f"# {op.name} {op.shape} {dist}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started

    print_table(rows)
    summary = summarize(rows, k_limit, floor)
    if args.markdown:
        print()
        print(markdown_table(rows))
    print()
    print(f"faithful policy: FAITHFUL_ERROR_RATIO_LIMIT = {k_limit:g}, FAITHFUL_ULP_FLOOR = {floor:g}")
    print(f"honest max k_needed {_fmt(summary['honest_max_k_needed'])} ({summary['honest_max_k_needed_case']}); "
          f"sign-symmetric downcast min k_needed {_fmt(summary['downcast_sym_min_k_needed'])} "
          f"({summary['downcast_sym_min_k_needed_case']})")
    if summary["downcast_all_positive_passing"]:
        print("downcasts passing on all-positive inputs (caught by the harness's sign_symmetric trial): "
              + "; ".join(summary["downcast_all_positive_passing"]))
    for label, m in [("current constants", summary["current_constants"])] + [
            (f"widest margin, {name.replace('_', ' ')} grid", best) for name, best in summary["search"].items()]:
        print(f"{label}: limit {m['error_ratio_limit']:.4g}, floor {m['ulp_floor']:.4g}: worst log2 margin "
              f"{m['log2_margin']:+.2f} (x{m['margin_factor']:.3g}); honest side {m['honest_log2_margin']:+.2f} "
              f"({m['binding_honest']}), downcast side {m['downcast_log2_margin']:+.2f} ({m['binding_downcast']})")
    if summary["tf32_hardware_not_engaged"]:
        print("TF32 allowed but not used (result identical to eager; not counted as a downcast): "
              + "; ".join(summary["tf32_hardware_not_engaged"]))
    print(summary_line(summary))
    print(f"({elapsed:.1f}s)")

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "machine": machine(args.device),
            "policy": {"name": "faithful", "error_ratio_limit": k_limit, "ulp_floor": floor, "eps": EPS32,
                       "constants_in_module": {"FAITHFUL_ERROR_RATIO_LIMIT": precision.FAITHFUL_ERROR_RATIO_LIMIT,
                                               "FAITHFUL_ULP_FLOOR": precision.FAITHFUL_ULP_FLOOR}},
            "quick": args.quick, "seeds": seeds, "seconds": round(elapsed, 1),
            "summary": summary, "summary_line": summary_line(summary), "cases": rows,
        }
        args.out.write_text(json.dumps(_json_safe(result), indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

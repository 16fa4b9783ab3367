"""The measurements behind degenerate-task detection, run where task code may run.

Two places run them: the trusted reference worker (``degenerate.detect_degenerate`` and the
synthesis filter, at the task's own sizes) and the synthesis composer (in-process, at its small
sampling sizes, to drop a degenerate chain before it costs a filter slot). Task code is never run
here in the trusted parent: this module is imported only by those two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from cuda_agent.environment.degenerate import DEFAULT_ATOL
from cuda_agent.environment.loading import clone_tree, seed_all, shares_memory, storage_span, tensors_in, to_device


def degeneracy_flags(model: Callable[..., object], get_inputs: Callable[[], Sequence[object]], device: str,
                     seeds: int = 3, atol: float = DEFAULT_ATOL) -> dict[str, str]:
    """Flag name -> one-line detail for every degeneracy the reference output shows.

    Flags (see ``degenerate.detect_degenerate``): ``non-finite-output``, ``tiny-output``,
    ``constant-output``, ``nondeterministic``, ``seed-insensitive``, ``input-ignored``,
    ``input-mutated``, ``output-aliases-input``.

    Args:
        model: the reference model (called under ``torch.no_grad``).
        get_inputs: the task's input generator; called under ``torch.device(device)``, so inputs
            are drawn where they are used (GPU-sized inputs drawn on the CPU take seconds).
        device: where the model and its inputs live.
        seeds: input seeds compared for ``seed-insensitive`` (>= 2).
        atol: outputs closer than this count as equal; outputs smaller than this are tiny.

    Returns:
        An empty dict when the outputs can tell a right kernel from a wrong one. A model with no
        floating-point output cannot be judged: ``{}`` too.
    """
    def draw() -> list:
        with torch.device(device):
            return list(get_inputs())

    written: list[int] = []  # the inputs the first forward pass wrote into
    aliased: list[int] = []  # the outputs of the first forward pass that are views of an input

    def outputs_of(inputs: list, watch: bool = False) -> list[torch.Tensor]:
        given = to_device(clone_tree(inputs), device)
        with torch.no_grad():
            out = model(*given)
        if watch:
            written.extend(k for k, (before, after) in enumerate(zip(to_device(inputs, device), given))
                           if isinstance(after, torch.Tensor) and not _unchanged(before, after))
            spans = [storage_span(t) for t in tensors_in(given)]
            aliased.extend(i for i, t in enumerate(tensors_in(out)) if shares_memory(t, spans))
        return [t.detach() for t in tensors_in(out) if t.is_floating_point()]  # compared where they are

    def outputs_for(seed: int, redraw: int | None = None, watch: bool = False) -> list[torch.Tensor]:
        seed_all(seed)
        inputs = draw()
        if redraw is not None:
            seed_all(seed + 7919)
            inputs[redraw] = draw()[redraw]
        seed_all(seed)
        return outputs_of(inputs, watch)

    base = outputs_for(1, watch=True)
    if not base:
        return {}
    flags = _magnitude_flags(base, atol)
    if written:
        flags["input-mutated"] = (f"forward() writes into input {written[0]}: a kernel judged on it may not "
                                  "(the verdict's guard forbids it), so the reference cannot be its own candidate")
    if aliased:
        flags["output-aliases-input"] = (f"output {aliased[0]} is a view of an input: a kernel's outputs must be "
                                         "fresh tensors (the verdict's guard), so the reference cannot be its own "
                                         "candidate")
    seed_all(1)
    same = draw()  # the base inputs again, run without re-seeding: random ops show
    if _differ(base, outputs_of(same), 0.0):
        flags["nondeterministic"] = "two runs on the same inputs gave different outputs"
    if all(not _differ(base, outputs_for(1 + s), atol) for s in range(1, seeds)):
        flags["seed-insensitive"] = "outputs are the same (within atol) for different input seeds"
    seed_all(1)
    for k in [k for k, value in enumerate(draw()) if isinstance(value, torch.Tensor)]:
        if not _differ(base, outputs_for(1, redraw=k), atol):
            flags.setdefault("input-ignored", f"re-drawing input {k} leaves the outputs unchanged (within atol)")
    return flags


def _magnitude_flags(outputs: list[torch.Tensor], atol: float) -> dict[str, str]:
    flags: dict[str, str] = {}
    if any(not bool(torch.isfinite(t).all()) for t in outputs):
        flags["non-finite-output"] = "the reference output contains NaN or Inf on standard inputs"
    for i, t in enumerate(t[torch.isfinite(t)] for t in outputs):
        if t.numel() == 0:
            continue
        scale = float(t.abs().max())
        spread = float(t.double().std()) if t.numel() > 1 else math.inf
        if scale < atol:
            flags["tiny-output"] = f"output {i}: max |value| {scale:.3g} < atol {atol:g}; zeros would pass"
        elif spread <= 1e-6 * scale:
            flags["constant-output"] = f"output {i}: spread {spread:.3g} is negligible vs magnitude {scale:.3g}"
    return flags


def _unchanged(before: object, after: torch.Tensor) -> bool:
    """Whether a forward pass left the input ``after`` as it was given (``before``, a separate
    copy): equal values, NaN equal to NaN (:func:`_differ` at zero tolerance, reached only when
    they are not plainly equal, so inputs without NaN cost no temporary of their size)."""
    if not isinstance(before, torch.Tensor) or before.dtype != after.dtype:
        return False
    if torch.equal(before, after):
        return True
    return (before.is_floating_point() or before.is_complex()) and not _differ([before], [after], 0.0)


def _differ(a: list[torch.Tensor], b: list[torch.Tensor], atol: float) -> bool:
    """True when the two output lists differ by more than ``atol`` anywhere (NaN-aware)."""
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return True
        both_nan = torch.isnan(x) & torch.isnan(y)
        diff = (x - y).abs()
        if bool(((diff > atol) & ~both_nan).any()) or bool((torch.isnan(x) != torch.isnan(y)).any()):
            return True
    return False

"""How many bytes a problem moves, known before any of them is allocated, and what that needs.

KernelBench's problems reach 16 GB of inputs; a verdict that learns a problem's size by running it
finds out from a killed worker. The reference worker measures the size on PyTorch's ``meta``
device instead (``get_inputs()`` and one forward pass there allocate nothing), and the evaluator
turns it into the memory each phase needs (:func:`memory_plan`): whether the problem fits at all,
how many correctness trials may be resident at once, and what the harness itself holds inside the
candidate's process (which is never charged to the candidate).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable


RESIDENT_TRIAL_BYTES = 2**30
"""Correctness trials are made ahead of the candidate while their bytes together stay under this:
small problems keep one pipelined batch of trials, GPU-sized ones are judged one trial at a time."""
SPARE_OUTPUT_BYTES = 2**31
"""The timing loop's output buffers (one per audited call) stay under this; huge outputs keep one
audited call."""


@dataclass(frozen=True)
class ProblemSize:
    """Bytes of one input set and of its outputs (the task's own dtypes)."""

    input_bytes: int
    largest_input_bytes: int
    float_input_bytes: int  # floating-point inputs: what a float64 reference doubles
    output_bytes: int | None  # None: the forward pass does not run on the meta device
    parameter_bytes: int
    note: str | None = None  # why a figure is a guess

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "ProblemSize":
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class MemoryPlan:
    """What one evaluation of the problem needs, in bytes, and how it is spread over time."""

    peak_bytes: int  # the largest phase: the float64 reference, a resident trial, or timing
    trial_bytes: int  # one resident correctness trial: inputs, references, the candidate's outputs
    resident_trials: int  # trials made ahead of the candidate at once (all of them for small problems)
    candidate_harness_bytes: int  # what the harness holds in the candidate's process while timing
    audits: int  # timed calls whose outputs are kept for checking (fewer for huge outputs)


def measure_size(get_inputs: Callable[[], Any], make_model: Callable[[], Any],
                 draw: Callable[[], list] | None = None,
                 forward: Callable[[int], Any] | None = None) -> ProblemSize:
    """The sizes from ``get_inputs()`` and a forward pass on the meta device (inside the trusted
    reference worker: task code). A forward pass the meta device cannot run (an op without a meta
    kernel such as ``torch.cov``, data-dependent shapes, ``.item()``, explicit CPU tensors) is run
    for real by ``forward(input_bytes)`` when given (its outputs are measured, then dropped; it
    returns None where the inputs leave no room for it), else ``output_bytes`` stays unknown, with
    a note. Unknown outputs are planned as large as the inputs: a 4 MB problem whose ``cov`` output
    is 1 GiB had all its trials made at once and ran a 16 GB lane out of memory. A ``get_inputs()``
    the meta device cannot run is measured from ``draw()`` (real inputs, freed at once) when given,
    with a note, else its error propagates."""
    import torch

    from cuda_agent.environment.loading import tensors_in

    drawn_note = None
    try:
        with torch.device("meta"):
            inputs = list(get_inputs())
    except Exception as exc:  # noqa: BLE001 - data-dependent input code; measured for real instead
        if draw is None:
            raise
        inputs = draw()
        drawn_note = (f"inputs measured by drawing them: get_inputs() does not run on the meta device "
                      f"({type(exc).__name__})")
    tensors = [t for t in tensors_in(inputs) if isinstance(t, torch.Tensor)]
    sizes = [t.numel() * t.element_size() for t in tensors]
    float_bytes = sum(s for t, s in zip(tensors, sizes) if t.is_floating_point())
    output_bytes, parameter_bytes, note = None, 0, None
    try:
        with torch.device("meta"), torch.no_grad():
            model = make_model()
            parameter_bytes = sum(p.numel() * p.element_size() for p in [*model.parameters(), *model.buffers()])
            outputs = model(*inputs)
        output_bytes = _output_bytes(outputs)
    except Exception as exc:  # noqa: BLE001 - any failure only makes the estimate coarser
        why = f"the forward pass does not run on the meta device ({type(exc).__name__})"
        output_bytes, unmeasured = _outputs_for_real(forward, sum(sizes))
        note = (f"outputs measured by one forward pass on the device: {why}" if output_bytes is not None
                else f"outputs not measured: {why}{unmeasured}")
    notes = "; ".join(n for n in (drawn_note, note) if n) or None
    return ProblemSize(sum(sizes), max(sizes, default=0), float_bytes, output_bytes, parameter_bytes, notes)


def _outputs_for_real(forward: Callable[[int], Any] | None, input_bytes: int) -> tuple[int | None, str]:
    """The bytes of ``forward(input_bytes)``'s outputs, or None and why (for the note)."""
    if forward is None:
        return None, ""
    try:
        outputs = forward(input_bytes)
    except Exception as exc:  # noqa: BLE001 - the verdict's own passes report a forward pass that fails
        return None, f", nor for real ({type(exc).__name__})"
    if outputs is None:
        return None, ", and the inputs leave no room to run it for real"
    return _output_bytes(outputs), ""


def _output_bytes(outputs: Any) -> int:
    """Bytes of the tensors a forward pass returned (meta or real)."""
    import torch

    from cuda_agent.environment.loading import tensors_in

    return sum(t.numel() * t.element_size() for t in tensors_in(outputs) if isinstance(t, torch.Tensor))


def memory_plan(size: ProblemSize, trials: int, needs_float64: bool, needs_tf32: bool, audits: int) -> MemoryPlan:
    """The memory of one evaluation on one device (CUDA memory, or host memory on the CPU backend).

    Per phase, from the pipeline's order of work: the float64 reference holds a float64 copy of the
    float inputs and its float64 outputs (the reference's own inputs are freed first); a resident
    trial holds its shared inputs, the references (fp32, float64, TF32), and the candidate's
    outputs with the copy it shares back; timing holds the shared inputs, one perturbed copy per
    call, the call's outputs with the previous call's, and one output buffer per audited call.
    Activations inside the forward passes are not counted (unknown before running): the plan is a
    lower bound, and a forward pass that needs more still ends in a clean out-of-memory error.
    Trials are made ahead while they fit :data:`RESIDENT_TRIAL_BYTES`, and timing keeps fewer
    audited calls when their spare buffers would not fit :data:`SPARE_OUTPUT_BYTES`.
    """
    inputs = size.input_bytes
    outputs = size.output_bytes if size.output_bytes is not None else inputs
    reference_copies = 1 + (2 if needs_float64 else 0) + (1 if needs_tf32 else 0)
    float64 = (2 * size.float_input_bytes + 2 * outputs + 2 * size.parameter_bytes) if needs_float64 else 0
    trial = inputs + reference_copies * outputs + 2 * outputs
    kept = audits if outputs == 0 else max(1, min(audits, SPARE_OUTPUT_BYTES // outputs))
    timing = 2 * inputs + 2 * outputs + kept * outputs
    peak = size.parameter_bytes + max(float64 + inputs, trial, timing)
    resident = max(1, min(trials, RESIDENT_TRIAL_BYTES // max(trial, 1)))
    return MemoryPlan(peak, trial, resident, inputs + 2 * outputs + kept * outputs, kept)


def gigabytes(nbytes: float) -> str:
    """``nbytes`` for people: ``"6.44 GB"``."""
    return f"{nbytes / 1e9:.3g} GB" if nbytes >= 1e7 else f"{math.ceil(nbytes / 1e3)} kB"

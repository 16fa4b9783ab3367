"""Untrusted worker: imports and runs the candidate ``ModelNew``, nothing else.

It never sees a secret seed or a reference output: it reads each input set from a file the
trusted reference worker wrote, runs the candidate on a clone, checks the runtime rules it can see
from inside (plain tensor outputs, no aliasing of inputs, inputs left unmodified), and writes the
outputs in the safe tensor format for the reference worker to judge. It also runs the timing loop.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.environment import tensor_io
from cuda_agent.environment.aten_ops import compute_ops, recorded_aten_ops
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.extension_calls import ExtensionCallCounter
from cuda_agent.environment.integrity import HarnessSnapshot
from cuda_agent.environment.loading import (
    clone_tree, copy_tree_into, import_file, seed_all, shares_storage, storage_span, tensors_in,
)
from cuda_agent.environment.solution import EXTENSION_NAME
from cuda_agent.environment.timed_cpus import pinned_to
from cuda_agent.environment.thread_starts import ThreadStartLog
from cuda_agent.environment.timing import FreshInputs, Timer, make_timer, measure
from cuda_agent.environment.worker import cap_address_space, serve, warm_device

DEFERRED_WORK_WAIT_S = 0.05
"""How long outputs must stay unchanged after forward() returned and the device was synchronised."""
SETTLE_HOLD_BYTES = 2 * 2**30
"""Most bytes of outputs (and their snapshots) held for one shared deferred-work window; a trial
that would hold more has its own window at once."""


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


class CandidateWorker:
    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.device = "cpu"
        # Bound before any candidate code is imported: rebinding module attributes later cannot
        # switch the checks off, and swapping code objects is detected by the snapshot (taken
        # after the thread-start stamping is installed, so undoing that is seen too).
        self._check = runtime_violations
        self._threads = ThreadStartLog()
        self._threads.install()
        self._snapshot = HarnessSnapshot(globals())
        self._extension = ExtensionCallCounter()
        self._extension.install()
        self._unsettled: list[tuple[int, list[torch.Tensor], list[torch.Tensor]]] = []
        """``(trial, outputs, snapshots)`` of trials whose deferred-work window is still open."""
        self._changed: list[int] = []
        """Trials whose window closed early (too much held) and whose outputs changed in it."""

    def warm(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Prestart: the device, and the dispatcher machinery the runtime op check uses (its first
        use imports ``torch._dynamo``, seconds that would otherwise land in the first trial)."""
        warm_device(msg)
        with torch.no_grad(), recorded_aten_ops():
            torch.ones(2, device=msg["device"]).add_(1)
        torch.ones(1 << 18).add_(1)  # large enough to start the CPU thread pool (its stacks) before any cap
        return {}

    def _tampering(self) -> list[dict[str, str]]:
        changed = self._snapshot.changed()
        if not changed:
            return []
        return [{"code": "harness-tampered",
                 "message": f"candidate code replaced harness functions: {', '.join(changed)}"}]

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg.get("address_space_mb"):
            cap_address_space(msg["address_space_mb"])
        self.device = msg["device"]
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        self._extension.extensions_dir = Path(msg["extensions_dir"])
        if msg["layout"] == "workdir":
            sys.path.insert(0, msg["extensions_dir"])  # where the protected build put cuda_extension
            self._extension.preload(EXTENSION_NAME)
        task = import_file(Path(msg["task_file"]), "candidate_task")
        solution = import_file(Path(msg["solution_file"]), "candidate_solution")
        if not hasattr(solution, "ModelNew"):
            raise AttributeError("solution module does not define ModelNew after import")
        seed = msg["init_seed"]
        seed_all(seed)
        init_inputs = task.get_init_inputs()
        seed_all(seed)
        reference = task.Model(*init_inputs)
        seed_all(seed)
        model = solution.ModelNew(*init_inputs)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"ModelNew(...) returned {type(model).__qualname__}, expected an nn.Module")
        notes = _transfer_weights(reference, model)
        self.model = model.to(self.device)
        return {"notes": notes}

    def run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run the candidate on one saved input set; save its outputs; report runtime-rule breaks.
        Whether the outputs change after return is judged by :meth:`settle`, once for all trials."""
        assert self.model is not None
        pristine = tensor_io.load(Path(msg["inputs_path"]), self.device)
        inputs = clone_tree(pristine)
        calls_before, called_ns = self._extension.calls, time.perf_counter_ns()
        with torch.no_grad(), recorded_aten_ops() as ops:
            outputs = self.model(*inputs)
            self._sync()
        returned_ns = time.perf_counter_ns()
        violations = self._check(outputs, inputs, pristine, self.device) + self._tampering()
        if self._threads.outlived(called_ns, returned_ns):
            violations.append({"code": "thread-left-running",
                               "message": "forward() left Python threads running after it returned"})
        if msg["require_extension_call"]:
            violations += self._torch_did_the_work(calls_before, ops)
        try:
            tensor_io.save(outputs, Path(msg["outputs_path"]))
        except tensor_io.TensorFormatError as exc:
            violations.append({"code": "output-unsupported-type", "message": f"forward() returned something that is not tensors: {exc}"})
        self._hold_for_settle(int(msg.get("trial", 0)), outputs)
        return {"violations": violations}

    def _hold_for_settle(self, trial: int, outputs: Any) -> None:
        tensors = [t for t in tensors_in(outputs) if isinstance(t, torch.Tensor)]
        self._unsettled.append((trial, tensors, [t.clone() for t in tensors]))
        held = sum(2 * t.numel() * t.element_size() for _, kept, _ in self._unsettled for t in kept)
        if held > SETTLE_HOLD_BYTES:
            self._changed += self._close_window()

    def settle(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The deferred-work window of every trial run since the last settle: outputs that change
        after forward() returned and the device was synchronised (a side stream or thread finishing
        the result outside the timed region). One wait for all trials instead of one per trial."""
        changed, self._changed = self._changed + self._close_window(), []
        return {"changed": changed}

    def _close_window(self) -> list[int]:
        if not self._unsettled:
            return []
        time.sleep(DEFERRED_WORK_WAIT_S)
        self._sync()
        changed = [trial for trial, kept, snapshots in self._unsettled
                   if any(not _same_values(a, b) for a, b in zip(snapshots, kept))]
        self._unsettled = []
        return changed

    def _torch_did_the_work(self, calls_before: int, ops: list[str]) -> list[dict[str, str]]:
        violations = []
        if self._extension.calls == calls_before:
            violations.append({"code": "no-custom-kernel", "message": (
                "forward() never called into the compiled extension "
                f"({', '.join(self._extension.modules) or 'none was loaded'}); the work must run in your kernels")})
        computed = compute_ops(ops)
        if computed:
            violations.append({"code": "torch-compute-at-runtime", "message": (
                f"PyTorch computed during forward() (ATen operators {', '.join(computed[:8])}); only allocation, "
                "views and copies may run outside your kernels")})
        return violations

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def time(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time ``forward`` on fresh perturbed inputs per call, auditing a random few timed calls.

        Fresh values defeat caching on input identity or content; holding the previous output alive
        and comparing storages catches a forward that hands back the same tensor every time; the
        audited calls' outputs, captured as soon as their batch is timed, go to the reference for
        checking.
        """
        assert self.model is not None
        config = TimingConfig(**msg["timing"])
        inputs = tensor_io.load(Path(msg["inputs_path"]), self.device)
        timer = make_timer(self.device, config, host_clock=msg.get("host_clock", False))
        calls = FreshInputs(inputs, config.input_noise, msg["noise_seed"])
        audit = TimedCallAudit(msg["audits"], random.Random(msg["audit_seed"]), self._threads, timer)
        reuse = OutputReuse()

        def after_call(call: int, outputs: Any) -> None:
            reuse(outputs)
            audit(call, outputs)

        with torch.no_grad(), pinned_to(msg.get("timed_cpus")) as pinned:
            stats = measure(self.model, timer, config, prepare=calls.for_call, after_call=after_call)
        violations = self._tampering() + audit.violations
        if reuse.found:
            violations.append({"code": "output-reused",
                               "message": "forward() returned storage it had already returned for an earlier call"})
        audited = []
        for call, outputs in sorted(audit.kept):
            path = Path(msg["out_dir"]) / f"timed_{call}.bin"
            tensor_io.save(outputs, path)
            audited.append({"call": call, "path": str(path)})
        return {"stats": stats.__dict__, "violations": violations, "audited": audited, "pinned": pinned}


class OutputReuse:
    """Whether a timed call returned storage the previous call returned (kept alive until then, so
    the allocator cannot hand the same memory out twice to an honest forward)."""

    def __init__(self) -> None:
        self.previous: Any = None
        self.found = False

    def __call__(self, outputs: Any) -> None:
        if self.previous is not None and shares_storage(outputs, self.previous):
            self.found = True
        self.previous = outputs


class TimedCallAudit:
    """A uniform random sample (reservoir) of ``size`` timed calls, outputs captured right after
    their batch was timed: a candidate cannot tell an audited call from any other until it has
    returned.

    Nor afterwards: every timed call's outputs are copied into one of ``size + 1`` buffers that are
    all allocated at the first timed call, so audited and unaudited calls leave the allocator in the
    same state. (Cloning only the audited outputs let a cache keyed by input address miss exactly on
    the calls after an audit, so the audit saw honest outputs while the others were stale.)
    """

    def __init__(self, size: int, rng: random.Random, threads: ThreadStartLog, timer: Timer) -> None:
        self.size, self.rng = size, rng
        self.seen = 0
        self.kept: list[tuple[int, Any]] = []
        self.violations: list[dict[str, str]] = []
        self._spares: list[Any] | None = None
        self._threads, self._timer = threads, timer
        self._since_ns = time.perf_counter_ns()
        """Threads started from here on are checked against the next batch's stop."""

    def __call__(self, call: int, outputs: Any) -> None:
        self.seen += 1
        if self._timer.stopped_ns > self._since_ns:  # the first call of a newly timed batch
            if self._threads.outlived(self._since_ns, self._timer.stopped_ns) and not self.violations:
                self.violations.append({"code": "thread-left-running",
                                        "message": "a timed forward() left a Python thread running when the timer stopped"})
            self._since_ns = self._timer.stopped_ns
        if self._spares is None:
            self._spares = [clone_tree(outputs) for _ in range(self.size + 1)]
        spare = self._spares.pop()
        if not copy_tree_into(spare, outputs):  # outputs changed structure or shape between calls
            spare = clone_tree(outputs)
        slot = len(self.kept) if len(self.kept) < self.size else self.rng.randrange(self.seen)
        if slot >= self.size:
            self._spares.append(spare)
        elif slot == len(self.kept):
            self.kept.append((call, spare))
        else:
            self._spares.append(self.kept[slot][1])
            self.kept[slot] = (call, spare)


def runtime_violations(outputs: Any, inputs: list, pristine: list, device: str) -> list[dict[str, str]]:
    violations = []
    input_spans = [storage_span(t) for t in tensors_in(inputs)]
    for i, out in enumerate(tensors_in(outputs)):
        if type(out) is not torch.Tensor:
            violations.append({"code": "output-not-plain-tensor",
                               "message": f"output {i} is a {type(out).__qualname__}, not a plain torch.Tensor"})
            continue
        if out.device.type != device:
            violations.append({"code": "output-wrong-device", "message": f"output {i} is on {out.device}, expected {device}"})
        start, end = storage_span(out)
        if out.untyped_storage().nbytes() and any(start < e and s < end for s, e in input_spans):
            violations.append({"code": "output-aliases-input",
                               "message": f"output {i} shares memory with an input; outputs must be fresh tensors"})
    for i, (after, before) in enumerate(zip(tensors_in(inputs), tensors_in(pristine))):
        if not _same_values(after, before):
            violations.append({"code": "input-mutated", "message": f"forward() modified input {i} in place"})
    return violations


def _transfer_weights(reference: torch.nn.Module, model: torch.nn.Module) -> list[str]:
    """Load the reference's state into ModelNew where names and shapes match; explain the rest."""
    ref_state, new_state = reference.state_dict(), model.state_dict()
    matched = {k: v for k, v in ref_state.items() if k in new_state and new_state[k].shape == v.shape}
    if matched:
        model.load_state_dict(matched, strict=False)
    notes = []
    new_values = list(model.state_dict().values())
    for name, value in ref_state.items():
        if name in matched:
            continue
        if name in new_state:
            reason = f"has shape {tuple(new_state[name].shape)}, Model's is {tuple(value.shape)}"
        elif any(v.shape == value.shape and _same_values(v, value) for v in new_values):
            continue  # same values under another name: constructed identically under the seed
        else:
            reason = "has no parameter or buffer of that name with equal values"
        notes.append(f"weights: Model.{name} {tuple(value.shape)} was not transferred: ModelNew {reason}; "
                     "its weights differ from the reference's, so outputs will differ")
    return notes


def main() -> None:
    worker = CandidateWorker()
    serve({"warm": worker.warm, "load": worker.load, "run": worker.run, "settle": worker.settle, "time": worker.time})


if __name__ == "__main__":
    main()

"""Untrusted worker: imports and runs the candidate ``ModelNew``, nothing else.

It never sees a secret seed or a reference output: it maps each input set the trusted reference
worker shared with it (:mod:`shared_tensors`: a device allocation on CUDA, a copy-on-write mapping
of a shared-memory file on the CPU backend), runs the candidate on it in place, checks the runtime
rules it can see from inside (plain tensor outputs, no aliasing of inputs, inputs left unmodified),
and shares its outputs back in a region of their own for the reference worker to judge. It also
runs the timing loop.
"""

from __future__ import annotations

import random
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from cuda_agent.environment import shared_tensors
from cuda_agent.environment.aten_ops import compute_ops, recorded_aten_ops
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.extension_calls import ExtensionCallCounter
from cuda_agent.environment.fingerprint import FingerprintKey
from cuda_agent.environment.integrity import HarnessSnapshot
from cuda_agent.environment.loading import import_file, seed_all, shares_memory, storage_span, tensors_in
from cuda_agent.environment.shared_tensors import flat_bytes
from cuda_agent.environment.solution import EXTENSION_NAME
from cuda_agent.environment.timed_cpus import pinned_to
from cuda_agent.environment.thread_starts import ThreadStartLog
from cuda_agent.environment.timing import FreshInputs, Timer, make_timer, measure
from cuda_agent.environment.worker import cap_address_space, peak_memory, serve, warm_device

DEFERRED_WORK_WAIT_S = 0.05
"""How long outputs must stay unchanged after forward() returned and the device was synchronised."""
SETTLE_HOLD_BYTES = 2 * 2**30
"""Most bytes of outputs (and their shared copies) held for one shared deferred-work window; a
trial that would hold more has its own window at once."""


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):  # one pass when nothing differs (NaN never compares equal: the slow path)
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


class _HeldTrial:
    """One trial's run, held until the reference has judged it: the mapped inputs, the
    candidate's outputs (watched for deferred work) and how they were shared with the reference:
    in place with their fingerprints (CUDA), or as a copy (the CPU backend)."""

    def __init__(self, trial: int, inputs: shared_tensors.IncomingShare, outputs: Any, shared: Any,
                 prints: list[int] | None, key: FingerprintKey | None) -> None:
        self.trial, self.inputs, self.shared, self.prints, self.key = trial, inputs, shared, prints, key
        self.outputs = [t for t in tensors_in(outputs) if isinstance(t, torch.Tensor)]
        self.settled = False

    @property
    def held_bytes(self) -> int:
        """What holding the trial open costs beyond its outputs: their copy (outputs shared in
        place cost nothing more, and their window must stay open until the reference has read
        them)."""
        if self.settled or self.prints is not None:
            return 0
        return sum(2 * t.numel() * t.element_size() for t in self.outputs)

    def changed_since_shared(self) -> bool:
        """Whether the candidate's outputs differ from what was shared when forward() returned."""
        if self.prints is not None:
            return [self.key(t) for t in self.shared.tensors] != self.prints
        shared = self.shared.view()
        try:
            copies = [t for t in tensors_in(shared.tree) if isinstance(t, torch.Tensor)]
            return any(not _same_values(copy, out) for copy, out in zip(copies, self.outputs))
        finally:
            shared.close()

    def settle(self) -> None:
        """The window is closed: the outputs stay shared until the reference has read them."""
        self.settled = True
        if self.prints is None:
            self.outputs = []

    def release(self) -> None:
        self.outputs = []
        if self.shared is not None:
            self.shared.release()
        self.inputs.close()


class CandidateWorker:
    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.device = "cpu"
        self.io_dir = self.out_dir = Path(".")
        # Bound before any candidate code is imported: rebinding module attributes later cannot
        # switch the checks off, and swapping code objects is detected by the snapshot (taken
        # after the thread-start stamping is installed, so undoing that is seen too).
        self._check = runtime_violations
        self._threads = ThreadStartLog()
        self._threads.install()
        self._snapshot = HarnessSnapshot(globals())
        self._extension = ExtensionCallCounter()
        self._extension.install()
        self._key: FingerprintKey | None = None
        self._held: dict[int, _HeldTrial] = {}
        """Trials run and not yet released, by index."""
        self._changed: list[int] = []
        """Trials whose window closed early (too much held) and whose outputs changed in it."""
        self._audited: list[shared_tensors.OutgoingShare] = []

    def warm(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Prestart: the device, and the dispatcher machinery the runtime op check uses (its first
        use imports ``torch._dynamo``, seconds that would otherwise land in the first trial)."""
        warm_device(msg)
        with torch.no_grad(), recorded_aten_ops():
            torch.ones(2, device=msg["device"]).add_(1)
        torch.ones(1 << 18).add_(1)  # large enough to start the CPU thread pool (its stacks) before any cap
        if msg["device"] == "cuda":
            self._key = FingerprintKey("cuda")
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
        if self.device == "cuda" and self._key is None:
            self._key = FingerprintKey("cuda")
        self.io_dir, self.out_dir = Path(msg["io_dir"]), Path(msg["out_dir"])
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
        """Run the candidate on one shared input set, in place; share its outputs back; report
        runtime-rule breaks. Whether the outputs change after return is judged by :meth:`settle`,
        once for all trials run since the last one."""
        assert self.model is not None
        trial = int(msg.get("trial", 0))
        incoming = shared_tensors.open_share(msg["inputs"], self.device, self.io_dir)
        inputs = list(incoming.tree)
        before = self._input_prints(inputs)
        calls_before, called_ns = self._extension.calls, time.perf_counter_ns()
        with torch.no_grad(), recorded_aten_ops() as ops:
            outputs = self.model(*inputs)
            self._sync()
        returned_ns = time.perf_counter_ns()
        changed = self._changed_inputs(inputs, before, msg["inputs"])
        violations = self._check(outputs, inputs, changed, self.device) + self._tampering()
        if self._threads.outlived(called_ns, returned_ns):
            violations.append({"code": "thread-left-running",
                               "message": "forward() left Python threads running after it returned"})
        if msg["require_extension_call"]:
            violations += self._torch_did_the_work(calls_before, ops)
        shared, prints = None, None
        try:
            shared, prints = self._share_outputs(outputs, trial)
        except shared_tensors.ShareError as exc:
            violations.append({"code": "output-unsupported-type", "message": f"forward() returned something that is not tensors: {exc}"})
        del inputs
        if not any(v["code"] == "output-aliases-input" for v in violations):
            incoming.close()  # the reference frees them as soon as it checks this trial
        self._hold(_HeldTrial(trial, incoming, outputs if shared is not None else None, shared, prints, self._key))
        return {"violations": violations, "outputs": shared.header if shared is not None else None}

    def _share_outputs(self, outputs: Any, trial: int) -> tuple[Any, list[int] | None]:
        """On CUDA, the outputs where they are, with their fingerprints (a GPU-sized output is not
        copied); where that cannot be (the CPU backend, memory without an IPC handle), a copy."""
        if self.device == "cuda":
            from cuda_agent.environment.cuda_ipc import CudaIpcError

            try:
                shared = shared_tensors.InPlaceShare(outputs)
                return shared, [self._key(t) for t in shared.tensors]
            except CudaIpcError:
                pass
        return shared_tensors.share(outputs, self.device, self.out_dir, f"outputs_{trial}.bin"), None

    def _input_prints(self, inputs: list) -> list[int] | None:
        """On CUDA, keyed fingerprints of the shared inputs before the run (the mapping is the
        reference's memory: writes land in it); the CPU backend compares with its file instead."""
        if self.device != "cuda":
            return None
        return [self._key(t) for t in tensors_in(inputs) if isinstance(t, torch.Tensor)]

    def _changed_inputs(self, inputs: list, before: list[int] | None, header: Any) -> list[int]:
        """Indices of the tensors the run wrote into: fingerprints on CUDA; on the CPU backend the
        copy-on-write mapping compared with a fresh mapping of the untouched file."""
        tensors = [t for t in tensors_in(inputs) if isinstance(t, torch.Tensor)]
        if before is not None:
            return [i for i, (t, fp) in enumerate(zip(tensors, before)) if self._key(t) != fp]
        pristine = shared_tensors.open_share(header, self.device, self.io_dir)
        try:
            originals = [t for t in tensors_in(pristine.tree) if isinstance(t, torch.Tensor)]
            return [i for i, (after, original) in enumerate(zip(tensors, originals)) if not _same_bytes(after, original)]
        finally:
            pristine.close()

    def _hold(self, held: _HeldTrial) -> None:
        self._held[held.trial] = held
        if sum(h.held_bytes for h in self._held.values()) > SETTLE_HOLD_BYTES:
            self._changed += self._close_window()

    def settle(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The deferred-work window of every trial run since the last settle: outputs that change
        after forward() returned and the device was synchronised (a side stream or thread finishing
        the result outside the timed region). One wait for all trials instead of one per trial."""
        changed, self._changed = self._changed + self._close_window(), []
        return {"changed": changed}

    def _close_window(self) -> list[int]:
        open_trials = [h for h in self._held.values() if not h.settled and h.shared is not None]
        if not open_trials:
            return []
        time.sleep(DEFERRED_WORK_WAIT_S)
        self._sync()
        changed = [h.trial for h in open_trials if h.changed_since_shared()]
        for held in open_trials:
            held.settle()
        return changed

    def release(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Free what the judged trials (and the kept timed calls) still hold."""
        for trial in msg.get("trials", []):
            held = self._held.pop(int(trial), None)
            if held is not None:
                held.release()
        if msg.get("audited"):
            for kept in self._audited:
                kept.release()
            self._audited = []
        if self.device == "cuda":  # memory the reference's next trial will need
            torch.cuda.empty_cache()
        return {}

    def stats(self, msg: dict[str, Any]) -> dict[str, Any]:
        """This worker's peak memory so far (host and device)."""
        return peak_memory(self.device)

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
        audited calls' outputs, captured as soon as their batch is timed into buffers shared with
        the reference, go to the reference for checking.
        """
        assert self.model is not None
        config = TimingConfig(**msg["timing"])
        incoming = shared_tensors.open_share(msg["inputs"], self.device, self.io_dir)
        timer = make_timer(self.device, config, host_clock=msg.get("host_clock", False))
        calls = FreshInputs(list(incoming.tree), config.input_noise, msg["noise_seed"])
        audit = TimedCallAudit(msg["audits"], random.Random(msg["audit_seed"]), self._threads, timer,
                               SpareShares(self.device, self.out_dir, "host" if msg.get("host_clock") else "events"))
        reuse = OutputReuse()

        def after_call(call: int, outputs: Any) -> None:
            reuse(outputs)
            audit(call, outputs)

        try:
            with torch.no_grad(), pinned_to(msg.get("timed_cpus")) as pinned:
                stats = measure(self.model, timer, config, prepare=calls.for_call, after_call=after_call)
        finally:
            calls.inputs, reuse.previous = None, []
            incoming.close()
            if self.device == "cuda":  # the loop's input copies and outputs: the audits' memory now
                torch.cuda.empty_cache()
        violations = self._tampering() + audit.violations
        if reuse.found:
            violations.append({"code": "output-reused",
                               "message": "forward() returned storage it had already returned for an earlier call"})
        audited = []
        for call, kept in sorted(audit.finish(), key=lambda entry: entry[0]):
            self._audited.append(kept)
            audited.append({"call": call, "outputs": kept.header})
        return {"stats": stats.__dict__, "violations": violations, "audited": audited, "pinned": pinned}


class SpareShares:
    """Where the timing loop copies the outputs of the calls it keeps for an audit: regions shared
    with the reference, so they reach it without another copy. Names are unique per timing loop."""

    def __init__(self, device: str, folder: Path, prefix: str) -> None:
        self.device, self.folder, self.prefix = device, folder, prefix
        self._made = 0

    def new(self, template: Any) -> shared_tensors.OutgoingShare:
        self._made += 1
        return shared_tensors.OutgoingShare(template, self.device, self.folder, f"{self.prefix}_{self._made}.bin")


class OutputReuse:
    """Whether a timed call returned storage the previous call returned.

    It holds only weak references to the previous outputs' storages: a storage an honest forward
    returned dies once the harness drops it (so a later allocation at the same address is a new
    storage), while one the candidate kept to hand out again stays alive. Holding the outputs
    themselves would keep a GPU-sized output alive for nothing."""

    def __init__(self) -> None:
        self.previous: list[weakref.ref] = []
        self.found = False

    def __call__(self, outputs: Any) -> None:
        spans = [storage_span(t) for t in tensors_in(outputs) if t.untyped_storage().nbytes()]
        for ref in self.previous:
            storage = ref()
            if storage is not None and any(start < storage.data_ptr() + storage.nbytes() and storage.data_ptr() < end
                                           for start, end in spans):
                self.found = True
        self.previous = [weakref.ref(t.untyped_storage()) for t in tensors_in(outputs)]


class TimedCallAudit:
    """A uniform random sample (reservoir) of ``size`` timed calls, outputs captured right after
    their batch was timed: a candidate cannot tell an audited call from any other until it has
    returned.

    Nor afterwards from the allocator: the ``size`` buffers a kept call's outputs are copied into are
    all allocated at the first timed call, outside torch's allocator (shared regions,
    :class:`SpareShares`, which go to the reference as they are), so kept and other calls leave it
    in the same state. (Cloning only the audited outputs with torch let a cache keyed by input
    address miss exactly on the calls after an audit, so the audit saw honest outputs while the
    others were stale.) A call is drawn for keeping before anything is copied, so a call that is not
    kept needs no buffer: a GPU-sized output costs ``size`` copies of device memory, not one more.
    Copies run after the batch is timed, and every batch starts after a device synchronisation.
    """

    def __init__(self, size: int, rng: random.Random, threads: ThreadStartLog, timer: Timer,
                 spares: SpareShares) -> None:
        self.size, self.rng = size, rng
        self.seen = 0
        self.kept: list[tuple[int, shared_tensors.OutgoingShare]] = []
        self.violations: list[dict[str, str]] = []
        self._spares: list[shared_tensors.OutgoingShare] | None = None
        self._make_spare = spares.new
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
            self._spares = [self._make_spare(outputs) for _ in range(self.size)]
        slot = len(self.kept) if len(self.kept) < self.size else self.rng.randrange(self.seen)
        if slot >= self.size:
            return  # not kept
        spare = self._spares.pop() if slot == len(self.kept) else self.kept[slot][1]  # the evicted call's
        if not spare.write(outputs):  # outputs changed structure or shape between calls
            spare.release()
            spare = self._make_spare(outputs)
            spare.write(outputs)
        if slot == len(self.kept):
            self.kept.append((call, spare))
        else:
            self.kept[slot] = (call, spare)

    def finish(self) -> list[tuple[int, shared_tensors.OutgoingShare]]:
        """The kept calls, each with its shared outputs; the other buffers are freed."""
        for spare in self._spares or []:
            spare.release()
        self._spares = []
        return self.kept


def runtime_violations(outputs: Any, inputs: list, changed_inputs: list[int], device: str) -> list[dict[str, str]]:
    """The rules the worker can see from inside: plain tensors on the device, no output sharing
    memory with an input, and no input written into (``changed_inputs``: indices of the input
    tensors whose bytes differ after the run)."""
    violations = []
    input_spans = [storage_span(t) for t in tensors_in(inputs)]
    for i, out in enumerate(tensors_in(outputs)):
        if type(out) is not torch.Tensor:
            violations.append({"code": "output-not-plain-tensor",
                               "message": f"output {i} is a {type(out).__qualname__}, not a plain torch.Tensor"})
            continue
        if out.device.type != device:
            violations.append({"code": "output-wrong-device", "message": f"output {i} is on {out.device}, expected {device}"})
        if shares_memory(out, input_spans):
            violations.append({"code": "output-aliases-input",
                               "message": f"output {i} shares memory with an input; outputs must be fresh tensors"})
    for i in changed_inputs:
        violations.append({"code": "input-mutated", "message": f"forward() modified input {i} in place"})
    return violations


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of two tensors of one dtype and shape (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(flat_bytes(a), flat_bytes(b))


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
    serve({"warm": worker.warm, "load": worker.load, "run": worker.run, "settle": worker.settle, "time": worker.time,
           "release": worker.release, "stats": worker.stats})


if __name__ == "__main__":
    main()

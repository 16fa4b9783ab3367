"""Trusted worker: runs only the task's reference code, never candidate code.

It builds the reference ``Model``, makes every input set from the secret seeds the parent sends,
computes the reference outputs (float64, fp32 with TF32 off, and TF32-on when the policy needs
it), hands the candidate its inputs in shared memory (:mod:`shared_tensors`: a device allocation
on CUDA, a shared-memory file on the CPU backend), compares the outputs the candidate shares back,
and times the eager and ``torch.compile`` baselines. Running it in its own process means candidate
code can neither see the expected outputs in memory nor change TF32 or other global state before
the baselines run.

Inputs are made where they are used: ``get_inputs()`` runs with the device as the default device
(a 6 GB ``torch.rand`` takes milliseconds there, a second on the host), and a problem whose
``get_inputs()`` cannot falls back to drawing on the host, which the verdict notes. Only one copy
of a trial's inputs is kept, the one shared with the candidate; every reference computation reads
a fresh private copy: redrawn from the trial's seed on CUDA (checked bit for bit against the first
draw: the candidate can write into the memory it was given), a copy-on-write mapping of the
trusted input file on the CPU backend. So a trial holds its inputs once, its references, and
nothing else, and trials are freed as soon as they are judged.
"""

from __future__ import annotations

import copy
import functools
import gc
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from cuda_agent.environment.aten_ops import recorded_value_shaped_ops
from cuda_agent.environment.comparison import References, rounding_dependent_shape, tf32_enabled, tf32_setting
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.degeneracy_probe import degeneracy_flags
from cuda_agent.environment.device_share import CONV_WORKSPACE_VARIABLE
from cuda_agent.environment.fingerprint import FingerprintKey
from cuda_agent.environment.loading import clone_tree, import_file, map_tensors, seed_all, tensors_in, to_device
from cuda_agent.environment.precision import POLICIES
from cuda_agent.environment.problem_size import measure_size
from cuda_agent.environment.shared_tensors import IncomingShare, OutgoingShare, ShareError, open_share, share
from cuda_agent.environment.task import REQUIRED_NAMES
from cuda_agent.environment.timed_cpus import pinned_to
from cuda_agent.environment.timing import FreshInputs, make_timer, measure, perturb_
from cuda_agent.environment.worker import cap_address_space, device_memory_cap_mb, peak_memory, serve, warm_device


def _to_double(tree):
    return map_tensors(lambda t: t.double() if t.is_floating_point() else t, tree)


def _contiguous(tree):
    """References laid out flat (the chunked comparison reads them as one run of elements)."""
    return map_tensors(lambda t: t.contiguous(), tree)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _warm_compile_probe(x: torch.Tensor) -> torch.Tensor:
    """What :meth:`ReferenceWorker.warm_compile` compiles: a fused pointwise op and a reduction."""
    return (x.relu() * 2).sum(0)


class NotReproducible(RuntimeError):
    """``get_inputs()`` drew different inputs from the same seed."""


class UnjudgeableReference(RuntimeError):
    """The reference's outputs cannot be compared with any candidate's (the message says why)."""


@dataclass
class _Trial:
    """One input set: how to make it again, the copy shared with the candidate, its references."""

    seed: int
    kind: str
    scale: float
    name: str  # of its input file (CPU backend)
    fingerprints: list[int] | None = None  # of the first draw (CUDA: later draws must match)
    kept: list | None = None  # a private copy, when drawing again does not give the same inputs
    shared: OutgoingShare | None = None
    refs: References | None = None
    notes: list[str] = field(default_factory=list)


class ReferenceWorker:
    def __init__(self) -> None:
        self.module = None
        self.model: torch.nn.Module | None = None
        self.model64: torch.nn.Module | None = None
        self.compiled: Any = None
        self.compiled_settings: set[str] = set()
        """The TF32 settings ``compiled`` has run under (compiled for) on the current task."""
        self.fp64_error: str | None = None
        self.device = "cpu"
        self.trials: dict[int, _Trial] = {}
        self.timed: _Trial | None = None
        """The trial the candidate is timed on: remade for timing and for its audits."""
        self.timing_share: OutgoingShare | None = None
        self.public_inputs: tuple[int, list] | None = None
        """``(seed, inputs)``: the public-seed inputs of the current task, drawn once for its
        baselines (the model only ever sees perturbed copies or clones of them)."""
        self.input_source = "device"
        self.policy = POLICIES.get("faithful")
        self.io_dir = self.out_dir = Path(".")
        self.key: FingerprintKey | None = None
        self.driver = "unknown"

    # -- ops ---------------------------------------------------------------------------------
    def warm(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Prestart: the device, the driver version (a subprocess, once per worker), a first
        comparison (its kernels and imports) and a first size measurement (a forward pass on the
        meta device imports ``torch._dynamo``: seconds), before any task exists."""
        warm_device(msg)
        device = msg["device"]
        if device == "cuda":
            self.driver = _driver_version()
        probe = torch.ones(4, device=device)
        POLICIES.get("faithful").compare(probe, References(probe, probe.double()))
        measure_size(lambda: [torch.ones(2)], torch.nn.ReLU)
        self.key = FingerprintKey(device)
        return {}

    def warm_compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Prestart, for evaluations that will compile their baseline: compile and run a tiny
        function, so that the task's own ``torch.compile`` finds dynamo, inductor, Triton and
        inductor's compile workers started (on an H100, a level-1 problem's compile fell from
        5.5-8.9 s to 0.1-0.4 s; the warm-up itself takes 5-7 s, off the critical path)."""
        started = time.perf_counter()
        compiled = torch.compile(_warm_compile_probe, mode=None if msg["mode"] == "default" else msg["mode"])
        with torch.no_grad():
            compiled(torch.ones(64, 64, device=msg["device"]))
        _sync(msg["device"])
        return {"seconds": time.perf_counter() - started}

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Import the task, build its model on the device, and measure its size on the meta
        device (nothing of the inputs' size is allocated; one real forward pass only where the
        meta device cannot run it)."""
        if msg.get("address_space_mb"):
            cap_address_space(msg["address_space_mb"])
        self.device = msg["device"]
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        self.policy = POLICIES.get(msg["precision"])
        self.io_dir, self.out_dir = Path(msg.get("io_dir", ".")), Path(msg.get("out_dir", "."))
        self._release_task()
        self.module = import_file(Path(msg["task_file"]), "reference_task")
        missing = [n for n in REQUIRED_NAMES if not hasattr(self.module, n)]
        if missing:
            raise AttributeError(f"task module does not define {', '.join(missing)} after import")
        seed_all(msg["init_seed"])
        init_inputs = self.module.get_init_inputs()
        seed_all(msg["init_seed"])
        self.model = self.module.Model(*init_inputs).to(self.device)
        size = measure_size(self.module.get_inputs, lambda: self.module.Model(*init_inputs),
                            lambda: self._draw_inputs(msg["init_seed"]),
                            lambda input_bytes: self._forward_once(msg["init_seed"], input_bytes))
        _give_back_cached_memory(self.device)
        self.compiled, self.compiled_settings = None, set()
        if self.policy.needs_float64:
            self._make_model64()
        if self.key is None or self.key.device.type != torch.device(self.device).type:
            self.key = FingerprintKey(self.device)
        return {"environment": self._environment(), "size": size.to_json_dict(), "memory": _memory_room(self.device)}

    def _forward_once(self, seed: int, input_bytes: int) -> Any:
        """One eager forward pass on inputs drawn from ``seed``, for the sizes of outputs the
        meta device cannot measure; None where twice the inputs exceed the free memory (a
        problem too large for the machine is refused by the memory plan, not by a failed
        allocation here)."""
        if 2 * input_bytes > _free_bytes(self.device):
            return None
        with torch.no_grad():
            return self.model(*self._draw_inputs(seed))

    def _make_model64(self) -> None:
        """The model's float64 copy, or why there is none (reported as a precision fallback)."""
        try:
            self.model64 = copy.deepcopy(self.model).double()
        except Exception as exc:  # noqa: BLE001 - reported as a precision fallback
            self.fp64_error = f"{type(exc).__name__}: {exc}"

    def _release_task(self) -> None:
        """Drop the previous task's model, trials and shares, and give its cached GPU memory back,
        so a worker that serves many tasks (the synthesis filter) holds only the current one's."""
        for trial in self.trials.values():
            self._free_trial(trial)
        self._free_timing()
        self.model = self.compiled = self.model64 = None
        self.compiled_settings = set()
        self.public_inputs = None
        self.fp64_error = None
        self.trials, self.timed = {}, None
        self.input_source = "device"
        if torch.cuda.is_initialized():
            gc.collect()
            torch.cuda.empty_cache()

    def make_trial(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Make one input set from a secret seed, compute its references, and share the inputs
        with the candidate (the reply carries the share's header)."""
        assert self.model is not None
        self.public_inputs = None  # the baselines are timed before any trial: their inputs are done with
        index, kind = msg["index"], msg["kind"]
        trial = _Trial(msg["seed"], kind, float(msg.get("scale", 1.0)), f"inputs_{index}.bin")
        if kind == "sign_symmetric":  # only for inputs that are all non-negative as drawn
            floats = [t for t in self._draw_inputs(trial.seed) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if not floats or any(bool((t < 0).any()) for t in floats):
                return {"skipped": "inputs already take both signs"}
            del floats
        try:
            refs = self._references(lambda: self._fresh(trial))
        except NotReproducible as exc:
            trial.kept, trial.fingerprints = self._draw_trial(trial), None  # one private copy from here on
            trial.notes.append(f"inputs kept instead of drawn again ({exc})")
            refs = self._references(lambda: self._fresh(trial))
        if kind != "standard" and not all(bool(torch.isfinite(t).all()) for t in tensors_in(refs.fp32)
                                          if t.is_floating_point()):
            self._free_trial(trial)
            return {"skipped": "the reference is not finite on this perturbed distribution"}
        trial.refs = refs
        if trial.shared is None:  # on CUDA always: the share gives the reference passes' memory back
            trial.shared = self._share_fresh(trial, trial.name)
        self.trials[index] = trial
        if msg.get("timed"):
            self.timed = trial
        return {"inputs": trial.shared.header, "fp64_error": self.fp64_error, "input_source": self.input_source,
                "notes": trial.notes}

    def check(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare the outputs the candidate shared for trial ``index`` with its references, then
        free the trial (its inputs stay only if it is the timed trial on the CPU backend)."""
        trial = self.trials.pop(msg["index"])
        if self.device == "cuda" and trial.shared is not None:  # its run is over (and it could write into it)
            trial.shared.release()
            trial.shared = None
        try:
            return self._compare(msg["outputs"], trial.refs)
        finally:
            trial.refs = None
            if trial is not self.timed:
                self._free_trial(trial)
            _give_back_cached_memory(self.device)

    def timing_inputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Share the timed trial's inputs again for the timing loop (a fresh copy: the one shared
        for its correctness run was the candidate's to write into)."""
        assert self.timed is not None
        self._free_timing()
        if self.timed.shared is not None:  # the CPU backend kept the trusted file
            return {"inputs": self.timed.shared.header}
        self.timing_share = self._share_fresh(self.timed, "timing_inputs.bin")
        return {"inputs": self.timing_share.header}

    def audit(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Check the outputs the candidate kept from one timed call: its perturbed inputs are made
        again from the timed trial (never from memory the candidate could write)."""
        assert self.timed is not None
        self._free_timing()
        make = lambda: perturb_(self._fresh(self.timed), msg["noise"], msg["seed"])  # noqa: E731
        try:
            return self._compare(msg["outputs"], self._references(make))
        finally:
            _give_back_cached_memory(self.device)

    def finish_timing(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Free what the timed trial still holds (after its audits)."""
        self._free_timing()
        if self.timed is not None:
            self._free_trial(self.timed)
        return {}

    def stats(self, msg: dict[str, Any]) -> dict[str, Any]:
        """This worker's peak memory so far (host and device)."""
        return peak_memory(self.device)

    # -- trials ------------------------------------------------------------------------------
    def _draw_trial(self, trial: _Trial) -> list:
        """The trial's inputs drawn from its seed, with its kind's change of distribution."""
        inputs = self._draw_inputs(trial.seed)
        if trial.kind == "scaled":
            inputs = [t.mul_(trial.scale) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                      for t in inputs]
        elif trial.kind == "sign_symmetric":
            generator = torch.Generator(device=self.device)
            generator.manual_seed(trial.seed ^ 0x5EED)
            for t in inputs:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    signs = torch.randint(0, 2, t.shape, device=t.device, generator=generator, dtype=torch.int8)
                    t.mul_(signs.mul_(2).sub_(1))
                    del signs
        return inputs

    def _fresh(self, trial: _Trial) -> list:
        """A private copy of the trial's inputs, for one reference computation (which may write
        into it). On CUDA it is drawn again and must match the first draw bit for bit (a problem
        drawn on the host keeps one private copy instead: drawing there costs a second per GB);
        on the CPU backend the first draw goes into the input file the candidate maps
        copy-on-write, and later copies are copy-on-write mappings of that trusted file."""
        if trial.kept is not None:
            return clone_tree(trial.kept)
        if self.device == "cuda" and self.input_source != "device":  # drawn on the host: seconds per GB
            trial.kept = self._draw_trial(trial)
            return clone_tree(trial.kept)
        if self.device != "cuda":
            if trial.shared is None:
                inputs = self._draw_trial(trial)
                trial.shared = self._share(inputs, trial.name)
                return inputs
            return list(open_share(trial.shared.header, "cpu", self.io_dir).tree)
        inputs = self._draw_trial(trial)
        fingerprints = [self.key(t) if isinstance(t, torch.Tensor) else hash(repr(t)) for t in inputs]
        if trial.fingerprints is None:
            trial.fingerprints = fingerprints
        elif fingerprints != trial.fingerprints:
            raise NotReproducible("get_inputs() drew different inputs from the same seed")
        return inputs

    def _share_fresh(self, trial: _Trial, name: str) -> OutgoingShare:
        """A share of a fresh copy of ``trial``'s inputs. On CUDA the share is an allocation of its
        own beside torch's cache, so the cache is given back before (the reference passes'
        temporaries: float64 inputs are twice the inputs) and after (the drawn copy it was made
        from): otherwise a 17 GB input fails its share on an 80 GB GPU, and a 6 GB one's timing
        loop runs beside 6 GB cached here for nothing."""
        _give_back_cached_memory(self.device)
        try:
            return self._share(self._fresh(trial), name)
        finally:
            _give_back_cached_memory(self.device)

    def _share(self, inputs: list, name: str) -> OutgoingShare:
        try:
            return share(list(inputs), self.device, self.io_dir, name)
        except ShareError as exc:
            raise TypeError(f"get_inputs() returned something that cannot be handed to the candidate: {exc}") from None

    def _free_trial(self, trial: _Trial) -> None:
        trial.refs = trial.kept = None
        if trial.shared is not None:
            trial.shared.release()
            trial.shared = None

    def _free_timing(self) -> None:
        if self.timing_share is not None:
            self.timing_share.release()
            self.timing_share = None

    def _references(self, fresh: Callable[[], list]) -> References:
        """float64 first (its float64 inputs and outputs are the largest tensors a trial makes,
        so nothing else of the trial exists yet), then fp32 with TF32 off, then TF32-on when the
        policy needs it; each from its own fresh copy of the inputs, laid out contiguously."""
        with torch.no_grad():
            fp64 = None
            if self.model64 is not None and self.fp64_error is None:
                try:
                    fp64 = self._float64_reference(fresh)
                except NotReproducible:
                    raise
                except Exception as exc:  # noqa: BLE001 - an op without a float64 kernel, or no room for it
                    self.fp64_error = f"{type(exc).__name__}: {exc}"
                if fp64 is None:  # the failed pass's tensors: freed only once its traceback is gone
                    _give_back_cached_memory(self.device)
            with tf32_enabled(False):
                fp32 = _contiguous(self.model(*fresh()))
            if fp64 is not None and (problem := rounding_dependent_shape(fp64, fp32)) is not None:
                raise UnjudgeableReference(problem)
            ref_tf32 = None
            if self.policy.needs_tf32_reference and self.device == "cuda":
                with tf32_enabled(True):
                    ref_tf32 = _contiguous(self.model(*fresh()))
        return References(fp32, fp64, ref_tf32)

    def _float64_reference(self, fresh: Callable[[], list]) -> Any:
        """The float64 model on float64 copies of fresh inputs. The float32 draw they were made
        from goes back to the device before the pass, and the float64 inputs after it: left in
        torch's cache, neither block can hold the next, larger or differently split, allocation
        (a 6.4 GB ReLU's reference peaked at 35 GB on an H200; its float64 pass needs ~26)."""
        inputs = _to_double(fresh())
        _give_back_cached_memory(self.device)
        output = _contiguous(self.model64(*inputs))
        del inputs
        _give_back_cached_memory(self.device)
        return output

    def _compare(self, header: Any, refs: References) -> dict[str, Any]:
        """Map the candidate's shared outputs and compare them with ``refs`` in place."""
        try:
            outputs: IncomingShare | None = open_share(header, self.device, self.out_dir)
        except ShareError as exc:
            return {"passed": False, "message": f"candidate outputs unreadable: {exc}"}
        try:
            result = self.policy.compare(outputs.tree, refs)
        finally:
            outputs.close()
        return {"passed": result.passed, "message": result.message, "max_abs_err": result.max_abs_err,
                "error_ratio": result.error_ratio, "fallback": result.fallback}

    def baselines(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time the requested baseline variants on inputs from the (public) init seed; only the
        timing loops run on ``timed_cpus`` (torch.compile compiles first, where the worker runs).

        The loops run back to back, so only the first warms up for ``warmup_ms`` (an idle GPU
        ramping its clocks, unless NVML reads them up already); the others warm up by ``warmup_calls`` (each model's first-call
        costs). On a GPU shared by several evaluations this is held alone: three more warm-ups
        would be ~0.6 s of every self-check verdict that no other evaluation can use the GPU in."""
        config = TimingConfig(**msg["timing"])
        inputs = self._public_inputs(msg["seed"])
        timer = make_timer(self.device, config)
        seconds: dict[str, float] = {}  # where the phase went: compiling, then each loop
        if any(variant.startswith("compile_") for variant in msg["variants"]):
            seconds["compile"] = self.compile(msg)["seconds"]  # ~0 when asked ahead
        stats, pinned = {}, True
        for index, variant in enumerate(msg["variants"]):
            started = time.perf_counter()
            kind, setting = variant.rsplit("_tf32_", 1)
            model = self.model if kind == "eager" else self._compiled(config)
            loop = config if index == 0 else replace(config, warmup_ms=0.0)
            with torch.no_grad(), tf32_setting(setting), pinned_to(msg.get("timed_cpus")) as moved:
                # The same per-call fresh inputs the candidate is timed with, for a like-for-like cost.
                fresh = FreshInputs(inputs, config.input_noise, seed=msg["seed"])
                stats[variant] = measure(model, timer, loop, prepare=fresh.for_call).__dict__
            pinned = pinned and moved
            seconds[variant] = time.perf_counter() - started
        return {"stats": stats, "pinned": pinned, "seconds": seconds}

    def compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Build ``torch.compile(Model)`` and run it once under each TF32 setting of the requested
        compile variants it has not run under yet (a setting is a guard: each one compiles anew),
        so that a later ``baselines`` request times it without paying for compilation (the
        synthesis filter compiles tasks in parallel and times them one at a time). Replies the
        seconds and the settings compiled now."""
        config = TimingConfig(**msg["timing"])
        settings = [variant.rsplit("_tf32_", 1)[1] for variant in msg["variants"] if variant.startswith("compile_")]
        new = [setting for setting in dict.fromkeys(settings) if setting not in self.compiled_settings]
        started = time.perf_counter()
        if new:
            inputs = self._public_inputs(msg["seed"])
            for setting in new:
                with torch.no_grad(), tf32_setting(setting):
                    self._compiled(config)(*clone_tree(inputs))
                self.compiled_settings.add(setting)
            _sync(self.device)
        return {"seconds": time.perf_counter() - started, "settings": new}

    def _compiled(self, config: TimingConfig) -> Any:
        if self.compiled is None:
            self.compiled = torch.compile(self.model, mode=None if config.compile_mode == "default" else config.compile_mode)
        return self.compiled

    def _public_inputs(self, seed: int) -> list:
        """The inputs from the public ``seed``, drawn once per task (drawing GPU-sized inputs on the
        CPU takes seconds). Callers hand the model clones or perturbed copies, never these."""
        if self.public_inputs is None or self.public_inputs[0] != seed:
            self.public_inputs = (seed, self._draw_inputs(seed))
        return self.public_inputs[1]

    def _draw_inputs(self, seed: int) -> list:
        """``get_inputs()`` under ``seed``, with the device as the default device. A problem whose
        ``get_inputs()`` cannot run that way (it fails, or returns host tensors: numpy, explicit
        CPU tensors) is drawn on the host and moved, as KernelBench draws every problem; the
        first such draw says so in :attr:`input_source` (the verdict's notes)."""
        seed_all(seed)
        if self.input_source == "device":
            try:
                with torch.device(self.device):
                    inputs = list(self.module.get_inputs())
                if all(t.device.type == torch.device(self.device).type for t in tensors_in(inputs)):
                    return inputs
                reason = "it returned host tensors"
            except Exception as exc:  # noqa: BLE001 - any failure sends this problem to the host path
                reason = f"it raised {type(exc).__name__}: {str(exc)[:200]}"
            self.input_source = f"host: get_inputs() does not run with {self.device} as the default device ({reason})"
            seed_all(seed)
        return to_device(list(self.module.get_inputs()), self.device)

    def footprint(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Memory one eager forward pass needs, in bytes, and the operators it ran whose output's
        shape follows from values (``value_shaped``: :func:`recorded_value_shaped_ops`; only such a
        forward can fail ``rounding_shape``). On CUDA the memory is the allocator's peak during the
        call (inputs, parameters, activations and outputs); on CPU, which keeps no peak statistics,
        the inputs, parameters, buffers and outputs: a lower bound."""
        inputs = self._draw_inputs(msg["seed"])  # its own copy: the forward pass may write into it
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.no_grad(), recorded_value_shaped_ops() as value_shaped:
            outputs = self.model(*inputs)
        if self.device == "cuda":
            torch.cuda.synchronize()
            return {"bytes": int(torch.cuda.max_memory_allocated()), "value_shaped": sorted(value_shaped)}
        held = [*tensors_in(inputs), *tensors_in(outputs), *self.model.parameters(), *self.model.buffers()]
        return {"bytes": sum(t.numel() * t.element_size() for t in held), "value_shaped": sorted(value_shaped)}

    def degeneracy(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Measure what ``degenerate.detect_degenerate`` reports (see there for the flags)."""
        flags = degeneracy_flags(self.model, self.module.get_inputs, self.device, int(msg["seeds"]), float(msg["atol"]))
        return {"flags": sorted(flags), "details": [flags[f] for f in sorted(flags)]}

    def rounding_shape(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Whether the outputs' shapes depend on rounding, by the verdict's own reference passes
        (float64, then float32 with TF32 off) on the inputs of each of ``seeds``, whatever the
        loaded policy: a verdict refuses such a task (``UnjudgeableReference``), so the synthesis
        filter drops it. The filter asks only for a forward that runs an operator whose output's
        shape follows from values (``value_shaped``, as ``footprint`` saw them), and on several
        inputs, since rounding may change such a shape on a few only (one ``unique_consecutive`` of
        1.8M floats lost an element in float32 on one input in six). A model without a float64
        pass (an op with no float64 kernel, no room for it) passes, as the verdict then falls back
        to float32 alone."""
        if self.model64 is None and self.fp64_error is None:
            self._make_model64()
        for seed in (int(seed) for seed in msg["seeds"]):
            try:
                self._references(functools.partial(self._draw_inputs, seed))
            except UnjudgeableReference as exc:
                return {"problem": f"{exc} (inputs of seed {seed}; {', '.join(msg['value_shaped'])} ran)"}
        return {"problem": None}

    def probe(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Import a task file and check its KernelBench names (for ``cuda-agent tasks list``)."""
        module = import_file(Path(msg["task_file"]), f"probe_{msg.get('index', 0)}")
        missing = [n for n in REQUIRED_NAMES if not hasattr(module, n)]
        if missing:
            raise AttributeError(f"does not define {', '.join(missing)} after import")
        return {}

    def _environment(self) -> dict[str, str]:
        env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": self.device}
        if self.device == "cuda":
            env["gpu"] = torch.cuda.get_device_name()
            env["cuda"] = str(torch.version.cuda)
            env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
            env["driver"] = self.driver if self.driver != "unknown" else _driver_version()
            if CONV_WORKSPACE_VARIABLE in os.environ:  # a shared GPU's cap, or the user's
                env["conv_workspace_cap_mb"] = os.environ[CONV_WORKSPACE_VARIABLE]
            if device_memory_cap_mb() is not None:  # a shared GPU's share of the device
                env["device_memory_cap_mb"] = str(device_memory_cap_mb())
        else:
            env["cpu"] = _cpu_model()
            env["threads"] = str(torch.get_num_threads())
        return env


DRIVER_FILE = Path("/proc/driver/nvidia/version")
"""The loaded NVIDIA kernel module's banner, which names the driver version."""


def driver_from_banner(banner: str) -> str | None:
    """The driver version in the kernel module's banner (``NVRM version: NVIDIA UNIX ... Kernel
    Module ... 580.159.04  Release Build ...``), or None if it names none."""
    match = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)(?:\s|$)", banner.splitlines()[0] if banner else "")
    return match.group(1) if match else None


def _driver_version() -> str:
    """Read from the kernel module's banner (instant) where there is one, else from ``nvidia-smi``
    (a subprocess: a fraction of a second, seconds on a busy host, which a worker warming up
    would spend holding a shared GPU)."""
    import subprocess

    try:
        found = driver_from_banner(DRIVER_FILE.read_text())
    except OSError:
        found = None
    if found:
        return found
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def _give_back_cached_memory(device: str) -> None:
    """Return the allocator's cached blocks to the device once a trial is done with: the other
    worker's next allocation (GPU-sized outputs, timing copies) must find the memory free, not
    reserved here."""
    if device == "cuda":
        torch.cuda.empty_cache()


def _free_bytes(device: str) -> int:
    """Free memory of the device (of the host for the CPU backend)."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _memory_room(device: str) -> dict[str, int]:
    """Free and total bytes of the device the evaluation runs on (on CUDA; the CPU backend's
    room is the host's, which the trusted parent reads itself)."""
    if device != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"device_free_bytes": int(free), "device_total_bytes": int(total)}


def _cpu_model() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    worker = ReferenceWorker()
    serve({"warm": worker.warm, "warm_compile": worker.warm_compile, "load": worker.load,
           "make_trial": worker.make_trial, "check": worker.check, "timing_inputs": worker.timing_inputs,
           "audit": worker.audit, "finish_timing": worker.finish_timing, "stats": worker.stats,
           "baselines": worker.baselines, "compile": worker.compile, "footprint": worker.footprint,
           "probe": worker.probe, "degeneracy": worker.degeneracy,
           "rounding_shape": worker.rounding_shape})


if __name__ == "__main__":
    main()

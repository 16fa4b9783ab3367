"""Trusted worker: runs only the task's reference code, never candidate code.

It builds the reference ``Model``, generates every input set from the secret seeds the parent
sends, computes the reference outputs (fp32 with TF32 off, float64, and TF32-on when the policy
needs it), compares candidate outputs read from the safe tensor format, and times the eager and
``torch.compile`` baselines. Running it in its own process means candidate code can neither see
the expected outputs in memory nor change TF32 or other global state before the baselines run.
"""

from __future__ import annotations

import copy
import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.environment import tensor_io
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.degeneracy_probe import degeneracy_flags
from cuda_agent.environment.loading import clone_tree, import_file, seed_all, tensors_in, to_device
from cuda_agent.environment.comparison import References, tf32_enabled, tf32_setting
from cuda_agent.environment.precision import POLICIES
from cuda_agent.environment.task import REQUIRED_NAMES
from cuda_agent.environment.timed_cpus import pinned_to
from cuda_agent.environment.timing import FreshInputs, make_timer, measure, perturbed, tree_bytes
from cuda_agent.environment.worker import serve, warm_device


def _to_double(tree):
    if isinstance(tree, torch.Tensor):
        return tree.double() if tree.is_floating_point() else tree
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_double(v) for v in tree)
    return tree


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


DEVICE_REFERENCE_SHARE = 0.2
"""Share of the GPU's memory the references of one evaluation may hold on the device (where the
candidate's outputs are compared with them, without a copy to the host); past it they are kept in
host memory and compared there."""


class ReferenceWorker:
    def __init__(self) -> None:
        self.module = None
        self.model: torch.nn.Module | None = None
        self.model64: torch.nn.Module | None = None
        self.compiled: Any = None
        self.fp64_error: str | None = None
        self.device = "cpu"
        self.refs: dict[int, References] = {}
        self.timed_inputs: list = []
        self.public_inputs: tuple[int, list] | None = None
        """``(seed, inputs)``: the public-seed inputs of the current task, drawn once for its
        baselines (the model only ever sees perturbed copies or clones of them)."""
        self.draw_on_device = False
        self.policy = POLICIES.get("faithful")
        self.deferred_inputs: dict[int, tuple[list, Path]] = {}
        """Input sets made ahead whose file is written only when asked (the post-timing trial's,
        made while the candidate is timed, must not exist before its timing ended)."""
        self.device_reference_bytes = 0
        self.driver = "unknown"

    # -- ops ---------------------------------------------------------------------------------
    def warm(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Prestart: the device, the driver version (a subprocess, once per worker) and a first
        comparison (its kernels and imports), before any task exists."""
        warm_device(msg)
        device = msg["device"]
        if device == "cuda":
            self.driver = _driver_version()
        probe = torch.ones(4, device=device)
        POLICIES.get("faithful").compare(probe, References(probe, probe.double()))
        return {}

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.device = msg["device"]
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        self.policy = POLICIES.get(msg["precision"])
        self.draw_on_device = bool(msg.get("draw_on_device", False))
        self._release_task()
        self.module = import_file(Path(msg["task_file"]), "reference_task")
        missing = [n for n in REQUIRED_NAMES if not hasattr(self.module, n)]
        if missing:
            raise AttributeError(f"task module does not define {', '.join(missing)} after import")
        seed_all(msg["init_seed"])
        init_inputs = self.module.get_init_inputs()
        seed_all(msg["init_seed"])
        self.model = self.module.Model(*init_inputs).to(self.device)
        self.compiled = None
        if self.policy.needs_float64:
            try:
                self.model64 = copy.deepcopy(self.model).double()
            except Exception as exc:  # noqa: BLE001 - reported as a precision fallback
                self.fp64_error = f"{type(exc).__name__}: {exc}"
        return {"environment": self._environment()}

    def _release_task(self) -> None:
        """Drop the previous task's model and give its cached GPU memory back, so a worker that
        serves many tasks (the synthesis filter) holds only the current one's."""
        self.model = self.compiled = self.model64 = None
        self.public_inputs = None
        self.fp64_error = None
        self.refs, self.deferred_inputs, self.device_reference_bytes = {}, {}, 0
        if torch.cuda.is_initialized():
            gc.collect()
            torch.cuda.empty_cache()

    def make_inputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Generate one input set from a secret seed, compute the references, save the inputs."""
        assert self.model is not None
        index, kind = msg["index"], msg["kind"]
        seed_all(msg["seed"])
        inputs = list(self.module.get_inputs())
        if kind == "scaled":
            inputs = [t * msg["scale"] if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
        elif kind == "sign_symmetric":
            floats = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if not floats or any(bool((t < 0).any()) for t in floats):
                return {"skipped": "inputs already take both signs"}
            inputs = [t * (torch.randint(0, 2, t.shape, dtype=t.dtype) * 2 - 1)
                      if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
        refs = self._references(inputs)
        if kind != "standard" and not all(bool(torch.isfinite(t).all()) for t in tensors_in(refs.fp32) if t.is_floating_point()):
            return {"skipped": "the reference is not finite on this perturbed distribution"}
        self.refs[index] = refs
        if msg.get("keep_inputs"):
            self.timed_inputs = inputs
        if msg.get("defer_write"):
            self.deferred_inputs[index] = (inputs, Path(msg["path"]))
        else:
            tensor_io.save(inputs, Path(msg["path"]))
        return {"fp64_error": self.fp64_error}

    def write_inputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Write the file of an input set made earlier with ``defer_write``."""
        inputs, path = self.deferred_inputs.pop(msg["index"])
        tensor_io.save(inputs, path)
        return {}

    def audit(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Check the saved outputs of one timed call: recreate its perturbed inputs from this
        worker's own copy of the timed trial's inputs (never the file the candidate read)."""
        inputs = perturbed(to_device(self.timed_inputs, self.device), msg["noise"], msg["seed"])
        return self._compare(Path(msg["path"]), self._references(list(inputs)))

    def _references(self, inputs: list) -> References:
        """fp32 (TF32 off), float64 and, when the policy needs it, TF32-on outputs of the reference.
        Kept on the device while they fit :data:`DEVICE_REFERENCE_SHARE` (checks then run there),
        else moved to host memory."""
        device_inputs = to_device(inputs, self.device)
        with torch.no_grad():
            with tf32_enabled(False):
                fp32 = self.model(*clone_tree(device_inputs))
            fp64 = None
            if self.model64 is not None and self.fp64_error is None:
                try:
                    fp64 = self.model64(*_to_double(clone_tree(device_inputs)))
                except Exception as exc:  # noqa: BLE001 - an op without a float64 kernel
                    self.fp64_error = f"{type(exc).__name__}: {exc}"
            ref_tf32 = None
            if self.policy.needs_tf32_reference and self.device == "cuda":
                with tf32_enabled(True):
                    ref_tf32 = self.model(*clone_tree(device_inputs))
        refs = References(fp32, fp64, ref_tf32)
        if self.device != "cuda":
            return refs
        held = tree_bytes([fp32, fp64, ref_tf32])
        if self.device_reference_bytes + held <= DEVICE_REFERENCE_SHARE * _device_memory_bytes():
            self.device_reference_bytes += held
            return refs
        refs = References(*(to_device(tree, "cpu") for tree in (fp32, fp64, ref_tf32)))
        torch.cuda.empty_cache()
        return refs

    def check(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare the candidate's saved outputs for trial ``index`` with the references."""
        return self._compare(Path(msg["path"]), self.refs[msg["index"]])

    def _compare(self, path: Path, refs: References) -> dict[str, Any]:
        """Load the candidate's outputs where the references are and compare them there."""
        device = next((t.device for t in tensors_in(refs.fp32)), torch.device("cpu"))
        try:
            outputs = tensor_io.load(path, device)
        except (tensor_io.TensorFormatError, OSError) as exc:
            return {"passed": False, "message": f"candidate outputs unreadable: {exc}"}
        result = self.policy.compare(outputs, refs)
        return {"passed": result.passed, "message": result.message, "max_abs_err": result.max_abs_err,
                "error_ratio": result.error_ratio, "fallback": result.fallback}

    def baselines(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time the requested baseline variants on inputs from the (public) init seed; only the
        timing loops run on ``timed_cpus`` (torch.compile compiles first, where the worker runs)."""
        config = TimingConfig(**msg["timing"])
        inputs = self._public_inputs(msg["seed"])
        timer = make_timer(self.device, config)
        if any(variant.startswith("compile_") for variant in msg["variants"]):
            self.compile(msg)
        stats, pinned = {}, True
        for variant in msg["variants"]:
            kind, setting = variant.rsplit("_tf32_", 1)
            model = self.model if kind == "eager" else self._compiled(config)
            with torch.no_grad(), tf32_setting(setting), pinned_to(msg.get("timed_cpus")) as moved:
                # The same per-call fresh inputs the candidate is timed with, for a like-for-like cost.
                fresh = FreshInputs(inputs, config.input_noise, seed=msg["seed"])
                stats[variant] = measure(model, timer, config, prepare=fresh.for_call).__dict__
            pinned = pinned and moved
        return {"stats": stats, "pinned": pinned}

    def compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Build ``torch.compile(Model)`` and run it once now, so that a later ``baselines`` request
        times it without paying for compilation (the synthesis filter compiles tasks in parallel
        and times them one at a time)."""
        config = TimingConfig(**msg["timing"])
        inputs = self._public_inputs(msg["seed"])
        started = time.perf_counter()
        with torch.no_grad():
            self._compiled(config)(*clone_tree(inputs))
        _sync(self.device)
        return {"seconds": time.perf_counter() - started}

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
        """``get_inputs()`` under ``seed``: on the CPU and then moved, as KernelBench draws them, or,
        when the task was loaded with ``draw_on_device`` (synthesis, which needs only the
        distribution), directly on the device."""
        seed_all(seed)
        if self.draw_on_device:
            with torch.device(self.device):
                return list(self.module.get_inputs())
        return to_device(list(self.module.get_inputs()), self.device)

    def footprint(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Memory one eager forward pass needs, in bytes. On CUDA the allocator's peak during the
        call (inputs, parameters, activations and outputs); on CPU, which keeps no peak statistics,
        the inputs, parameters, buffers and outputs: a lower bound."""
        inputs = self._draw_inputs(msg["seed"])  # its own copy: the forward pass may write into it
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            outputs = self.model(*inputs)
        if self.device == "cuda":
            torch.cuda.synchronize()
            return {"bytes": int(torch.cuda.max_memory_allocated())}
        held = [*tensors_in(inputs), *tensors_in(outputs), *self.model.parameters(), *self.model.buffers()]
        return {"bytes": sum(t.numel() * t.element_size() for t in held)}

    def degeneracy(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Measure what ``degenerate.detect_degenerate`` reports (see there for the flags)."""
        flags = degeneracy_flags(self.model, self.module.get_inputs, self.device, int(msg["seeds"]), float(msg["atol"]))
        return {"flags": sorted(flags), "details": [flags[f] for f in sorted(flags)]}

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
        else:
            env["cpu"] = _cpu_model()
            env["threads"] = str(torch.get_num_threads())
        return env


def _driver_version() -> str:
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def _device_memory_bytes() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


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
    serve({"warm": worker.warm, "write_inputs": worker.write_inputs, "load": worker.load, "make_inputs": worker.make_inputs, "check": worker.check, "audit": worker.audit,
           "baselines": worker.baselines, "compile": worker.compile, "footprint": worker.footprint,
           "probe": worker.probe, "degeneracy": worker.degeneracy})


if __name__ == "__main__":
    main()

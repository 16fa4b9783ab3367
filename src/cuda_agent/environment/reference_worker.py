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
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.environment import tensor_io
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.loading import clone_tree, import_file, seed_all, tensors_in, to_device
from cuda_agent.environment.precision import POLICIES, References, tf32_enabled
from cuda_agent.environment.task import REQUIRED_NAMES
from cuda_agent.environment.timing import FreshInputs, make_timer, measure, perturbed
from cuda_agent.environment.worker import serve


def _to_double(tree):
    if isinstance(tree, torch.Tensor):
        return tree.double() if tree.is_floating_point() else tree
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_double(v) for v in tree)
    return tree


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


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


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
        self.policy = POLICIES.get("faithful")

    # -- ops ---------------------------------------------------------------------------------
    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.device = msg["device"]
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        self.policy = POLICIES.get(msg["precision"])
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
        self.fp64_error = None
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
        tensor_io.save(inputs, Path(msg["path"]))
        return {"fp64_error": self.fp64_error}

    def audit(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Check the saved outputs of one timed call: recreate its perturbed inputs from this
        worker's own copy of the timed trial's inputs (never the file the candidate read)."""
        inputs = perturbed(to_device(self.timed_inputs, self.device), msg["noise"], msg["seed"])
        return self._compare(Path(msg["path"]), self._references(list(inputs)))

    def _references(self, inputs: list) -> References:
        device_inputs = to_device(inputs, self.device)
        with torch.no_grad():
            with tf32_enabled(False):
                fp32 = to_device(self.model(*clone_tree(device_inputs)), "cpu")
            fp64 = None
            if self.model64 is not None and self.fp64_error is None:
                try:
                    fp64 = to_device(self.model64(*_to_double(clone_tree(device_inputs))), "cpu")
                except Exception as exc:  # noqa: BLE001 - an op without a float64 kernel
                    self.fp64_error = f"{type(exc).__name__}: {exc}"
            ref_tf32 = None
            if self.policy.needs_tf32_reference and self.device == "cuda":
                with tf32_enabled(True):
                    ref_tf32 = to_device(self.model(*clone_tree(device_inputs)), "cpu")
        _sync(self.device)
        if self.device == "cuda":
            torch.cuda.empty_cache()
        return References(fp32, fp64, ref_tf32)

    def check(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare the candidate's saved outputs for trial ``index`` with the references."""
        return self._compare(Path(msg["path"]), self.refs[msg["index"]])

    def _compare(self, path: Path, refs: References) -> dict[str, Any]:
        try:
            outputs = tensor_io.load(path)
        except (tensor_io.TensorFormatError, OSError) as exc:
            return {"passed": False, "message": f"candidate outputs unreadable: {exc}"}
        result = self.policy.compare(outputs, refs)
        return {"passed": result.passed, "message": result.message, "max_abs_err": result.max_abs_err,
                "error_ratio": result.error_ratio, "fallback": result.fallback}

    def baselines(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time the requested baseline variants on inputs from the (public) init seed."""
        config = TimingConfig(**msg["timing"])
        inputs = self._public_inputs(msg["seed"])
        timer = make_timer(self.device, config)
        stats = {}
        for variant in msg["variants"]:
            kind, setting = variant.rsplit("_tf32_", 1)
            model = self.model if kind == "eager" else self._compiled(config)
            with torch.no_grad(), tf32_enabled(setting == "on"):
                # The same per-call fresh inputs the candidate is timed with, for a like-for-like cost.
                fresh = FreshInputs(inputs, config.input_noise, seed=msg["seed"])
                stats[variant] = measure(model, timer, config, prepare=fresh.for_call).__dict__
        return {"stats": stats}

    def compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Build ``torch.compile(Model)`` and run it once now, so that a later ``baselines`` request
        times it without paying for compilation (the synthesis filter compiles tasks in parallel
        and times them one at a time)."""
        config = TimingConfig(**msg["timing"])
        inputs = self._public_inputs(msg["seed"])
        started = time.perf_counter()
        with torch.no_grad():
            self._compiled(config)(*inputs)
        _sync(self.device)
        return {"seconds": time.perf_counter() - started}

    def _compiled(self, config: TimingConfig) -> Any:
        if self.compiled is None:
            self.compiled = torch.compile(self.model, mode=None if config.compile_mode == "default" else config.compile_mode)
        return self.compiled

    def _public_inputs(self, seed: int) -> list:
        seed_all(seed)
        return to_device(list(self.module.get_inputs()), self.device)

    def footprint(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Memory one eager forward pass needs, in bytes. On CUDA the allocator's peak during the
        call (inputs, parameters, activations and outputs); on CPU, which keeps no peak statistics,
        the inputs, parameters, buffers and outputs: a lower bound."""
        inputs = self._public_inputs(msg["seed"])
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
        atol = float(msg["atol"])
        flags: dict[str, str] = {}

        def draw() -> list:
            """Inputs made on the device: the checks need fresh draws, not the CPU stream's values,
            and drawing GPU-sized inputs on the CPU (then copying them) took seconds per draw."""
            with torch.device(self.device):
                return list(self.module.get_inputs())

        def outputs_of(inputs: list) -> list[torch.Tensor]:
            with torch.no_grad():
                out = self.model(*to_device(clone_tree(inputs), self.device))
            return [t.detach() for t in tensors_in(out) if t.is_floating_point()]  # compared where they are

        def outputs_for(seed: int, redraw: int | None = None) -> list[torch.Tensor]:
            seed_all(seed)
            inputs = draw()
            if redraw is not None:
                seed_all(seed + 7919)
                inputs[redraw] = draw()[redraw]
            seed_all(seed)
            return outputs_of(inputs)

        base = outputs_for(1)
        if not base:
            return {"flags": [], "details": ["no floating-point outputs: degeneracy checks do not apply"]}
        if any(not bool(torch.isfinite(t).all()) for t in base):
            flags["non-finite-output"] = "the reference output contains NaN or Inf on standard inputs"
        finite = [t[torch.isfinite(t)] for t in base]
        for i, t in enumerate(finite):
            if t.numel() == 0:
                continue
            scale = float(t.abs().max())
            spread = float(t.double().std()) if t.numel() > 1 else math.inf
            if scale < atol:
                flags["tiny-output"] = f"output {i}: max |value| {scale:.3g} < atol {atol:g}; zeros would pass"
            elif spread <= 1e-6 * scale:
                flags["constant-output"] = f"output {i}: spread {spread:.3g} is negligible vs magnitude {scale:.3g}"
        seed_all(1)
        same = draw()  # run twice without re-seeding: random ops show
        if _differ(outputs_of(same), outputs_of(same), 0.0):
            flags["nondeterministic"] = "two runs on the same inputs gave different outputs"
        if all(not _differ(base, outputs_for(1 + s), atol) for s in range(1, int(msg["seeds"]))):
            flags["seed-insensitive"] = "outputs are the same (within atol) for different input seeds"
        seed_all(1)
        for k in [k for k, value in enumerate(draw()) if isinstance(value, torch.Tensor)]:
            if not _differ(base, outputs_for(1, redraw=k), atol):
                flags.setdefault("input-ignored", f"re-drawing input {k} leaves the outputs unchanged (within atol)")
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
            try:
                import subprocess

                env["driver"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=10,
                ).stdout.strip().splitlines()[0]
            except (OSError, IndexError, subprocess.SubprocessError):
                env["driver"] = "unknown"
        else:
            env["cpu"] = _cpu_model()
            env["threads"] = str(torch.get_num_threads())
        return env


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
    serve({"load": worker.load, "make_inputs": worker.make_inputs, "check": worker.check, "audit": worker.audit,
           "baselines": worker.baselines, "compile": worker.compile, "footprint": worker.footprint,
           "probe": worker.probe, "degeneracy": worker.degeneracy})


if __name__ == "__main__":
    main()

"""The deterministic composer: fuse 1-5 seed operators into one KernelBench-format task.

Sampling is seeded and shape-aware. Operators are drawn family by family (so elementwise ops,
the largest family, do not crowd out the rest) and chained on a live tensor: each op runs on the
previous op's output before it is kept, so constructor sizes, extra inputs and output shapes are
the real ones. The chain is then written out as source (``Model``, ``get_inputs``,
``get_init_inputs``), executed in-process as a check (composition is trusted code built from
torch ops), and, with a target window, re-sized until its eager time lands in it.

Without a target window the same seed always gives byte-identical code; with one, the sizes depend
on measured times, which are stepped in powers of two so that only a time on a step's edge can
change them.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import torch

from cuda_agent.environment.degeneracy_probe import degeneracy_flags
from cuda_agent.synth.device_lock import measuring
from cuda_agent.synth.input_size import DEFAULT_MAX_INPUT_MB
from cuda_agent.synth.mining import SeedCatalogue, import_object, instantiate
from cuda_agent.synth.records import SeedOp, TaskRecord

MAX_OPS = 5
_DIM_NAMES = {1: ("dim",), 2: ("batch_size", "dim"), 3: ("batch_size", "dim1", "dim2"),
              4: ("batch_size", "channels", "height", "width")}
_BASE_SIZES = {1: ((1024, 2048, 4096),), 2: ((16, 32), (64, 128, 256)), 3: ((8, 16), (16, 32, 64), (64, 128)),
               4: ((4, 8), (8, 16, 32), (32, 64), (32, 64))}
"""Per rank and dim, the sizes a composition starts from (widths are multiples of 8: heads, groups)."""
_MAX_ATTEMPTS = 40
_PICKS_PER_STEP = 8
_MAX_GROWTH = 64
"""An intermediate may hold at most this many times the first input's elements."""
_MAX_LIVE_BYTES = 3 << 30
"""Sizing keeps the inputs plus twice the largest intermediate (a chain holds its inputs and about
one op's input and output at once) under this, inside the filter's 4 GB default bound on CUDA; the
inputs alone stay under the size bound (``max_input_mb``, :mod:`cuda_agent.synth.input_size`)."""
_SIZING_RETRIES = 3
"""Times a resize that fails (an op's size limit, out of memory) is tried again with a smaller step."""
_MAX_PARAMS = 1 << 27
_SIZING_STEPS = 6
_TIMED_CALLS = 3


_SIZING_MARGIN = 3.0
"""Sizing aims inside the window by this factor at each end (e.g. 3-33 ms for 1-100 ms), so that
the filter's own measurement, taken another time and another way, still lands in the window."""


class CompositionError(RuntimeError):
    """No valid composition was found for the seed (the catalogue offers too few compatible ops)."""


class _StepFailed(Exception):
    """An operator does not fit the chain at this point."""


def compose(catalogue: SeedCatalogue, seed: int, n_ops: int | None = None,
            target_ms: tuple[float, float] | None = None, device: str = "cpu", *,
            allow_stochastic: bool = False, allow_inplace: bool = False,
            max_input_mb: float = DEFAULT_MAX_INPUT_MB) -> TaskRecord:
    """Compose one task from ``catalogue``.

    Args:
        catalogue: mined seed operators.
        seed: the only source of randomness: the same seed gives the same task.
        n_ops: operators to fuse, 1-5; drawn from the seed when ``None``.
        target_ms: ``(low, high)`` eager-time window in ms; the batch size is scaled (in powers of
            two, at most 6 times) until a forward pass on ``device`` lands well inside it (by
            :data:`_SIZING_MARGIN`), else the closest size is kept (the execution filter decides).
        device: where sizing is timed.
        allow_stochastic: also use ops whose output is random (dropout); off by default.
        allow_inplace: also use ops that write into their input; off by default.
        max_input_mb: sizing grows the inputs up to this bound (MiB), not beyond.

    Raises:
        ValueError: ``n_ops`` outside 1-5, or a malformed ``target_ms``.
        CompositionError: no chain of ``n_ops`` compatible operators found in 40 attempts.
    """
    if n_ops is not None and not 1 <= n_ops <= MAX_OPS:
        raise ValueError(f"n_ops must be between 1 and {MAX_OPS}, got {n_ops}")
    if target_ms is not None and not (len(target_ms) == 2 and 0 < target_ms[0] < target_ms[1]):
        raise ValueError(f"target_ms must be (low, high) with 0 < low < high, got {target_ms!r}")
    pool = sorted((op for op in catalogue.ops if "float32" in op.dtypes and (allow_stochastic or not op.stochastic)
                   and (allow_inplace or not op.inplace)), key=lambda op: op.name)
    if not pool:
        raise CompositionError("the catalogue has no usable operator (float32, deterministic, out of place)")
    rng = random.Random(seed)
    n_ops = n_ops or rng.randint(1, MAX_OPS)
    rng_devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    timing_threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=rng_devices), warnings.catch_warnings(), _intra_op_threads(1):
        warnings.simplefilter("ignore")  # deprecation notes of the ops we run are no news to the caller
        for _ in range(_MAX_ATTEMPTS):
            chain = _sample_chain(rng, pool, n_ops)
            if chain is None:
                continue
            try:
                _check(chain, seed)
            except Exception:  # noqa: BLE001 - any failure of the composed code: try another sample
                continue
            if target_ms is None:
                code = chain.source()
            else:
                code = _sized_code(chain, seed, target_ms, device, timing_threads, int(max_input_mb * 2**20))
            source = "transformers" if any(op.source == "transformers" for op in chain.ops) else "torch"
            return TaskRecord(code=code, ops=[op.name for op in chain.ops], composer="deterministic", seed=seed,
                              source=source, seed_ops_version=catalogue.version)
    raise CompositionError(f"no chain of {n_ops} compatible operators found for seed {seed} "
                           f"in {_MAX_ATTEMPTS} attempts ({len(pool)} usable operators)")


@dataclass(frozen=True)
class DeterministicComposer:
    """``seed -> TaskRecord`` with fixed settings; picklable, so the pipeline can run it in
    worker processes (:attr:`parallel`)."""

    catalogue: SeedCatalogue
    n_ops: int | None = None
    target_ms: tuple[float, float] | None = None
    device: str = "cpu"
    max_input_mb: float = DEFAULT_MAX_INPUT_MB
    """The size bound sizing grows the inputs up to (MiB)."""
    parallel: ClassVar[str] = "processes"
    """How the pipeline runs several at once: sizing is CPU and GPU work, not I/O."""

    @property
    def device_memory_mb(self) -> float:
        """Device memory one composer process may hold while sizing (it frees it after each seed)."""
        return _MAX_LIVE_BYTES / 2**20 if self.device.startswith("cuda") else 0.0

    def __call__(self, seed: int) -> TaskRecord:
        try:
            return compose(self.catalogue, seed, self.n_ops, target_ms=self.target_ms, device=self.device,
                           max_input_mb=self.max_input_mb)
        finally:
            if self.device.startswith("cuda"):  # the next seed's sizes differ: cached blocks only crowd the GPU
                torch.cuda.empty_cache()


# --------------------------------------------------------------------------- sampling

def _pick(rng: random.Random, ops: list[SeedOp]) -> SeedOp:
    """A family uniformly, then an op of it uniformly."""
    families = sorted({op.family for op in ops})
    family = rng.choice(families)
    return rng.choice([op for op in ops if op.family == family])


def _sample_chain(rng: random.Random, pool: list[SeedOp], n_ops: int) -> _Chain | None:
    """Draw the first op and input sizes, then extend the chain op by op on a live tensor.

    Returns:
        The chain, or ``None`` if it got stuck before ``n_ops`` operators.
    """
    first = _pick(rng, [op for op in pool if n_ops == 1 or op.shape_rule != "scalar"])
    rank = rng.choice(first.ranks)
    sizes = [rng.choice(choices) for choices in _BASE_SIZES[rank]]
    if first.square and rank >= 2:
        sizes[-1] = sizes[-2]
    dims = dict(zip(_DIM_NAMES[rank], sizes))
    positive = rng.random() < 0.25  # torch.rand inputs: lets log, sqrt, ... start a chain
    chain = _Chain(dims, positive)
    for index in range(n_ops):
        last = index == n_ops - 1
        used = {op.name for op in chain.ops}
        candidates = [op for op in pool if op.name not in used and (last or op.shape_rule != "scalar")]
        if index == 0:
            candidates = [first]
        for _ in range(_PICKS_PER_STEP):
            fitting = [op for op in candidates if chain.fits(op)]
            if not fitting:
                return None
            op = _pick(rng, fitting)
            try:
                chain.add(op, last)
                break
            except _StepFailed:
                candidates.remove(op)
        else:
            return None
    return chain


# --------------------------------------------------------------------------- the chain and its source

class _Chain:
    """Operators applied to a live tensor, with the source lines that reproduce them."""

    def __init__(self, dims: dict[str, int], positive: bool, device: str = "cpu") -> None:
        self.dims, self.positive, self.device = dims, positive, device
        self.ops: list[SeedOp] = []
        self.constants = dict(dims)
        """Module-level size constants: the first input's dims, then sizes derived along the chain."""
        self.init_params: list[str] = []
        self.inputs: list[tuple[str, list[str]]] = [("x", list(dims))]
        self.module_lines: list[str] = []
        self.forward_lines: list[str] = []
        self.imports: set[str] = set()
        self.symbols: list[str | None] = list(dims)
        """The constant naming each dim of the live tensor, where one does."""
        self.x = self._random(tuple(dims.values()), 0)
        self.first_numel = self.x.numel()
        self.peak_numel = self.first_numel
        """Elements of the largest tensor along the chain (for the memory estimate of sizing)."""

    def _random(self, shape: tuple[int, ...], seed: int) -> torch.Tensor:
        generator = torch.Generator(self.device).manual_seed(seed)
        draw = torch.rand if self.positive else torch.randn
        return draw(shape, generator=generator, device=self.device)

    def fits(self, op: SeedOp) -> bool:
        shape = self.x.shape
        return self.x.dim() in op.ranks and (not op.square or shape[-1] == shape[-2]) \
            and (op.operand == "same" or op.arity == 1 or self.x.dim() >= 2)

    def add(self, op: SeedOp, last: bool) -> None:
        """Apply ``op`` to the live tensor and record its source lines.

        Raises:
            _StepFailed: it does not run here, or its output is not finite, too large, or a scalar
                before the last op.
        """
        shape = tuple(self.x.shape)
        extra_shapes = [shape[:-2] + (shape[-1], shape[-2]) if op.operand == "transposed" else shape] * (op.arity - 1)
        extras = [self._random(s, 1 + i) for i, s in enumerate(extra_shapes)]
        try:
            with torch.device(self.device):
                fn = self._build(op, shape, [self.x, *extras])
                with torch.no_grad():
                    out = fn(self.x, *extras)
        except Exception as exc:  # noqa: BLE001 - the op does not fit here
            raise _StepFailed(f"{op.name}: {exc}") from None
        if op.output_index is not None:
            out = out[op.output_index]
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.numel() == 0 \
                or (out.dim() == 0 and not last) or not bool(torch.isfinite(out).all()):
            raise _StepFailed(f"{op.name}: unusable output")
        self._record(op)
        self.peak_numel = max(self.peak_numel, out.numel())
        self.symbols = self._symbols(out.shape)
        self.x = out
        self.ops.append(op)

    def _build(self, op: SeedOp, shape: tuple[int, ...], inputs: list[torch.Tensor]) -> Any:
        """The op's callable, once a dry run on the meta device (no memory, no compute) showed that
        its parameters and output stay within bounds; ops without meta support run only if they
        do not expand (``torch.diagflat`` on a large input would take the machine)."""
        target = import_object(op.name)
        config_cls = import_object(op.config) if op.config else None
        try:
            with torch.device("meta"):
                fn = instantiate(op.kind, target, op.init, shape, config_cls)
                out = fn(*[t.to("meta") for t in inputs])
            params = sum(p.numel() for p in fn.parameters()) if op.kind == "module" else 0
            out = out if op.output_index is None else out[op.output_index]
            numel = out.numel()
        except Exception:  # noqa: BLE001 - no meta kernel: judge by the probe's shape rule
            if op.shape_rule == "expand":
                raise
            params = numel = 0
        if params > _MAX_PARAMS or numel > _MAX_GROWTH * self.first_numel:
            raise ValueError(f"too large: {params} parameters, {numel} output elements")
        return instantiate(op.kind, target, op.init, shape, config_cls)

    def _symbols(self, out_shape: torch.Size) -> list[str | None]:
        """Names for the output dims: the input dim's name where the size is unchanged."""
        if tuple(out_shape) == tuple(self.x.shape):
            return self.symbols
        free = list(zip(self.symbols, self.x.shape))
        names = []
        for size in out_shape:
            match = next((pair for pair in free if pair[1] == size and pair[0]), None)
            if match is not None:
                free.remove(match)
            names.append(match[0] if match else None)
        return names

    def _size_name(self, axis: int) -> str:
        """The module-level constant holding the live tensor's size in ``axis``."""
        axis %= self.x.dim()
        name = self.symbols[axis]
        if name is None:
            size = int(self.x.shape[axis])
            name = next((n for n, v in self.constants.items() if v == size and n not in self.dims), None)
            if name is None:
                name = f"size{sum(n not in self.dims for n in self.constants) + 1}"
                self.constants[name] = size
        return name

    def _init_expr(self, value: Any) -> str:
        """Constructor argument source: placeholders become ``__init__`` parameters."""
        if value in ("{dim1}", "{last}"):
            name = self._size_name(1 if value == "{dim1}" else -1)
            if name not in self.init_params:
                self.init_params.append(name)
            return name
        if isinstance(value, list):
            return "[" + ", ".join(self._init_expr(v) for v in value) + "]"
        return repr(value)

    def _record(self, op: SeedOp) -> None:
        """Source lines for ``op`` applied to the live tensor (before it is replaced by the output)."""
        args = ["x"]
        axes = list(range(self.x.dim()))
        if op.operand == "transposed":
            axes = axes[:-2] + axes[:-3:-1]
        for _ in range(op.arity - 1):
            dims = [self.symbols[axis] or self._size_name(axis) for axis in axes]
            arg = f"y{len(self.inputs)}"
            self.inputs.append((arg, dims))
            args.append(arg)
        index = "" if op.output_index is None else f"[{op.output_index}]"
        if op.kind == "function":
            call = ", ".join(args + [f"{k}={_call_expr(v)}" for k, v in op.init.items()])
            self.forward_lines.append(f"x = {self._callee(op.name)}({call}){index}")
            return
        attr = _attribute_name(op.name, self.module_lines)
        kwargs = []
        for key, value in op.init.items():
            if key == "config" and op.config:
                config = ", ".join(f"{k}={self._init_expr(v)}" for k, v in value.items())
                kwargs.append(f"config={self._callee(op.config)}({config})")
            else:
                kwargs.append(f"{key}={self._init_expr(value)}")
        self.module_lines.append(f"self.{attr} = {self._callee(op.name)}({', '.join(kwargs)})")
        self.forward_lines.append(f"x = self.{attr}({', '.join(args)}){index}")

    def _callee(self, name: str) -> str:
        """How the source refers to a dotted name, adding the import it needs."""
        if name.startswith("torch.nn.functional."):
            self.imports.add("import torch.nn.functional as F")
            return "F." + name.removeprefix("torch.nn.functional.")
        if name.startswith("torch.nn.") and name.count(".") == 2:
            return "nn." + name.removeprefix("torch.nn.")
        if name.startswith("torch."):
            return name
        module, _, short = name.rpartition(".")
        self.imports.add(f"from {module} import {short}")
        return short

    def source(self) -> str:
        """The chain as a KernelBench-format problem."""
        params = ", ".join(["self", *self.init_params])
        maker = "torch.rand" if self.positive else "torch.randn"
        names = " -> ".join(op.name.rsplit(".", 1)[-1] for op in self.ops)
        imports = sorted(self.imports, key=lambda line: (not line.startswith("import"), line))
        lines = ["import torch", "import torch.nn as nn", *imports, ""]
        lines += [f"{name} = {value}" for name, value in self.constants.items()]
        lines += ["", "", "class Model(nn.Module):", f'    """Fused {names} (composed from seed operators)."""', "",
                  f"    def __init__({params}):", "        super().__init__()"]
        lines += [f"        {line}" for line in self.module_lines]
        lines += ["", f"    def forward(self, {', '.join(name for name, _ in self.inputs)}):"]
        lines += [f"        {line}" for line in self.forward_lines]
        lines += ["        return x", "", "", "def get_inputs():"]
        tensors = ", ".join(f"{maker}({', '.join(dims)})" for _, dims in self.inputs)
        lines += [f"    return [{tensors}]", "", "", "def get_init_inputs():",
                  f"    return [{', '.join(self.init_params)}]", ""]
        return "\n".join(lines)


def _call_expr(value: Any) -> str:
    """Function keyword source: placeholders read the live tensor's shape."""
    if value in ("{dim1}", "{last}"):
        return "x.shape[1]" if value == "{dim1}" else "x.shape[-1]"
    if isinstance(value, list):
        return "[" + ", ".join(_call_expr(v) for v in value) + "]"
    return repr(value)


def _attribute_name(name: str, taken: list[str]) -> str:
    short = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.rsplit(".", 1)[-1]).lower()
    attr, n = short, 1
    while any(line.startswith(f"self.{attr} = ") for line in taken):
        n += 1
        attr = f"{short}_{n}"
    return attr


# --------------------------------------------------------------------------- checking and sizing

def _realise(ops: list[SeedOp], dims: dict[str, int], positive: bool, device: str) -> _Chain:
    """Replay a sampled chain on inputs of ``dims`` on ``device`` (sizes for a GPU are too large
    to run on the CPU in passing).

    Raises:
        _StepFailed: an op no longer fits at these sizes.
    """
    chain = _Chain(dims, positive, device)
    for index, op in enumerate(ops):
        chain.add(op, index == len(ops) - 1)
    return chain


def _load(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "composed_task"}
    exec(compile(code, "<composed task>", "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace


def _check(chain: _Chain, seed: int) -> None:
    """Run the chain's source as a task, ``Model(*get_init_inputs())(*get_inputs())``, and probe
    it for degeneracy at the sampling sizes: a chain the execution filter would reject as
    degenerate, nondeterministic or input-independent is dropped here, where another sample costs
    milliseconds, not a filter slot on the device (the filter still checks the sized task).

    Raises:
        Exception: the source does not load or run, its output is not a finite tensor, or it is
            degenerate (:func:`degeneracy_flags`).
    """
    torch.manual_seed(seed)
    namespace = _load(chain.source())
    model = namespace["Model"](*namespace["get_init_inputs"]())
    with torch.no_grad():
        out = model(*namespace["get_inputs"]())
    if not isinstance(out, torch.Tensor) or not bool(torch.isfinite(out).all()):
        raise _StepFailed("the composed task's output is not a finite tensor")
    flags = degeneracy_flags(model, namespace["get_inputs"], "cpu", seeds=2)
    if flags:
        raise _StepFailed(f"degenerate at sampling sizes: {', '.join(sorted(flags))}")


@contextlib.contextmanager
def _intra_op_threads(count: int) -> Iterator[None]:
    """Run torch CPU ops on ``count`` threads, then restore the caller's setting.

    Composing runs many small ops once each: extra threads only add overhead there, and on a busy
    machine batched LAPACK calls under nested threading can take 1000x longer (``torch.linalg.qr``
    on 128 small matrices: 8 s on 2 threads, 8 ms on one). Timing uses the caller's setting.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _eager_ms(code: str, device: str, seed: int, threads: int) -> float:
    """Median time of a few eager forward passes of the task on ``device`` (after one warm-up),
    with ``threads`` intra-op threads.

    Raises:
        Exception: the code does not load or run there, or its output is not a finite tensor.
    """
    with _intra_op_threads(threads):
        return _median_forward_ms(code, device, seed)


def _median_forward_ms(code: str, device: str, seed: int) -> float:
    torch.manual_seed(seed)
    namespace = _load(code)
    with torch.device(device):  # create on the device: CPU-side randn of GPU-sized inputs takes seconds
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = list(namespace["get_inputs"]())
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    with torch.no_grad(), measuring(device):
        for call in range(_TIMED_CALLS + 1):
            sync()
            started = time.perf_counter()
            out = model(*inputs)
            sync()
            if call:
                times.append((time.perf_counter() - started) * 1e3)
            elif not isinstance(out, torch.Tensor) or not bool(torch.isfinite(out).all()):
                raise _StepFailed("the composed task's output is not a finite tensor")
    return statistics.median(times)


def _sized_code(chain: _Chain, seed: int, target_ms: tuple[float, float], device: str, threads: int,
                max_input_bytes: int) -> str:
    """Scale the first input dim that no constructor depends on, in powers of two, towards the window
    (narrowed by :data:`_SIZING_MARGIN`), as far as the memory caps allow (inputs ≤ ``max_input_bytes``).

    Returns:
        The source whose eager time was closest to the window (log distance); the first one if
        timing fails.
    """
    margin = min(_SIZING_MARGIN, (target_ms[1] / target_ms[0]) ** 0.25)
    low, high = target_ms[0] * margin, target_ms[1] / margin
    free = next((name for name in chain.dims if name not in chain.init_params), None)
    best_code, best_gap = chain.source(), math.inf
    for _ in range(_SIZING_STEPS):
        code = chain.source()
        try:
            ms = _eager_ms(code, device, seed, threads)
        except Exception:  # noqa: BLE001 - too big for this device: keep the best so far
            break
        gap = 0.0 if low <= ms <= high else min(abs(math.log(ms / low)), abs(math.log(ms / high)))
        if gap < best_gap:
            best_code, best_gap = code, gap
        if gap == 0.0 or free is None:
            break
        step = min(2.0 ** round(math.log2(math.sqrt(low * high) / ms)), _max_growth(chain, max_input_bytes))
        resized = _resized(chain, free, step, device)
        if resized is None:
            break
        chain = resized
    return best_code


def _max_growth(chain: _Chain, max_input_bytes: int) -> float:
    """The largest power-of-two factor the sizes may grow by within the memory caps (sizes are
    taken to scale with the free dim: a batch dimension)."""
    input_bytes = chain.first_numel * 4 * len(chain.inputs)
    live_bytes = input_bytes + 2 * chain.peak_numel * 4
    limit = min(max_input_bytes / input_bytes, _MAX_LIVE_BYTES / live_bytes)
    return 2.0 ** math.floor(math.log2(limit)) if limit >= 1 else 1.0


def _resized(chain: _Chain, free: str, step: float, device: str) -> _Chain | None:
    """The chain replayed with its ``free`` dim scaled by ``step``; a growth step that fails (an op's
    own size limit, device memory) is retried at its square root, :data:`_SIZING_RETRIES` times at most.

    Returns:
        The replayed chain, or ``None`` when no step changes the size or none runs.
    """
    for _ in range(_SIZING_RETRIES):
        size = max(1, int(chain.dims[free] * step))
        if size == chain.dims[free]:
            return None
        try:
            with measuring(device):  # GPU work: keep it off another composer's timing
                return _realise(chain.ops, {**chain.dims, free: size}, chain.positive, device)
        except Exception:  # noqa: BLE001 - does not run at this size: try a smaller step
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            if step <= 2:
                return None
            step = 2.0 ** (math.log2(step) // 2)
    return None

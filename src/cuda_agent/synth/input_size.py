"""The size bound: a task's inputs may not exceed :data:`DEFAULT_MAX_INPUT_MB`; a larger task is
scaled down, not dropped.

Every verdict on a task makes, keeps and compares copies of its inputs, so its cost grows with
their bytes: issue 28's budgets ask ≤ 5 s for a median verdict on this dataset and ≤ 1 s more per GB.
A 1 GiB bound keeps the worst task within a few seconds of the median while leaving room for
cheap element-wise chains to reach the 1 ms floor of the eager window (one pass over 1 GiB on an
H100 takes ~0.35 ms each way).

Measuring is exact and costs no memory: ``get_inputs()`` runs with the meta device as default, so
tensors carry shape and dtype only. Resizing works on the source, as the deterministic composer
sizes tasks: it scales a module-level integer size constant that ``get_inputs()`` reads and that
neither ``get_init_inputs()`` nor ``Model`` reads (a batch size, not a layer width), halving it
in powers of two until the inputs fit, then the next such constant if one is not enough.

Task code runs here, so callers in a trusted process use :class:`InputSizer`, a worker process
that sees no GPU; ``python -m cuda_agent.synth.input_size`` is that worker.
"""

from __future__ import annotations

import ast
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.environment.worker import RemoteError, WorkerError, WorkerProcess, child_env, serve
from cuda_agent.python_source import parse_source

DEFAULT_MAX_INPUT_MB = 1024.0
"""Default bound on the bytes of one task's ``get_inputs()`` (MiB); see the module docstring."""

REQUEST_TIMEOUT_S = 120.0
"""Limit on one request to the worker (importing ``transformers`` the first time takes seconds)."""


class SizeBoundError(ValueError):
    """A task's inputs exceed the bound and no size constant scales them down enough."""


@dataclass(frozen=True)
class InputSize:
    """What ``get_inputs()`` returns, measured without allocating."""

    shapes: tuple[tuple[int, ...], ...]
    """Shape of each tensor input, in order (non-tensor inputs are left out)."""
    nbytes: int
    """Bytes of all tensor inputs together."""


@dataclass(frozen=True)
class Bounded:
    """A task's code within the bound, and what it took."""

    code: str
    nbytes: int
    """Input bytes of ``code``."""
    original_nbytes: int
    """Input bytes before resizing (equal to ``nbytes`` when nothing was scaled)."""
    scaled: dict[str, tuple[int, int]]
    """``{constant: (old value, new value)}`` for every size constant that was scaled down."""

    @property
    def resized(self) -> bool:
        return bool(self.scaled)


def measure(code: str) -> InputSize:
    """Run the task's ``get_inputs()`` on the meta device (executes ``code``: trusted processes only).

    Raises:
        Exception: whatever the code raises when it is executed or ``get_inputs()`` is called.
    """
    import torch

    namespace: dict[str, Any] = {"__name__": "sized_task"}
    exec(compile(code, "<task>", "exec"), namespace)  # noqa: S102 - the caller's worker process runs it
    with torch.device("meta"):
        inputs = namespace["get_inputs"]()
    tensors = [value for value in _flatten(inputs) if isinstance(value, torch.Tensor)]
    return InputSize(tuple(tuple(t.shape) for t in tensors), sum(t.numel() * t.element_size() for t in tensors))


_DRAWS = {"torch.randn", "torch.rand"}
"""Calls whose float32 result :func:`read_size` can size from the source alone."""


def read_size(code: str) -> InputSize | None:
    """The inputs' size read from the source, without running it, for the template both composers
    write: ``get_inputs()`` returns a list of ``torch.randn(...)`` / ``torch.rand(...)`` whose sizes
    are integer literals or module-level integer constants. Anything else gives ``None`` (then
    :func:`measure` runs the code). Saves starting a worker for the many tasks far under the bound.
    """
    try:
        tree = parse_source(code)
    except SyntaxError:
        return None
    constants = {name: value for name, (value, _) in _constants(code).items()}
    function = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "get_inputs"),
                    None)
    if function is None or len(function.body) != 1 or "set_default_dtype" in code:
        return None
    returned = function.body[0]
    if not (isinstance(returned, ast.Return) and isinstance(returned.value, (ast.List, ast.Tuple))):
        return None
    shapes = []
    for call in returned.value.elts:
        if not (isinstance(call, ast.Call) and not call.keywords and ast.unparse(call.func) in _DRAWS):
            return None
        dims = [constants.get(arg.id) if isinstance(arg, ast.Name) else
                arg.value if isinstance(arg, ast.Constant) and type(arg.value) is int else None for arg in call.args]
        if any(dim is None for dim in dims):
            return None
        shapes.append(tuple(dims))
    return InputSize(tuple(shapes), sum(4 * math.prod(shape) for shape in shapes))


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


def bound(code: str, max_bytes: int) -> Bounded:
    """``code`` with its inputs scaled down to at most ``max_bytes`` (unchanged if they fit).

    Raises:
        SizeBoundError: no module-level size constant brings the inputs under the bound.
        Exception: the code does not run (as :func:`measure`).
    """
    original = measure(code).nbytes
    scaled: dict[str, tuple[int, int]] = {}
    nbytes = original
    free = _free_size_constants(code)
    for name in free:
        if nbytes <= max_bytes:
            break
        old = value = _constants(code)[name][0]
        while nbytes > max_bytes and value > 1:
            factor = 2 ** max(1, math.ceil(math.log2(nbytes / max_bytes)))
            value = max(1, value // factor)
            code = _set_constant(code, name, value)
            nbytes = measure(code).nbytes
        scaled[name] = (old, value)
    if nbytes > max_bytes:
        raise SizeBoundError(f"inputs of {original / 2**20:.4g} MiB exceed the bound of {max_bytes / 2**20:.4g} MiB "
                             f"and scaling the free size constants ({', '.join(free) or 'none'}) down to 1 leaves "
                             f"{nbytes / 2**20:.4g} MiB")
    return Bounded(code, nbytes, original, scaled)


def _constants(code: str) -> dict[str, tuple[int, ast.Constant]]:
    """Module-level ``NAME = <int>`` assignments: ``{name: (value, literal node)}``."""
    found = {}
    for node in parse_source(code).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and type(node.value.value) is int):
            found[node.targets[0].id] = (node.value.value, node.value)
    return found


def _free_size_constants(code: str) -> list[str]:
    """Size constants ``get_inputs()`` reads and ``get_init_inputs()`` and ``Model`` do not, in
    source order: scaling them changes the inputs, never a layer's shape."""
    tree = parse_source(code)
    read_by: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            read_by[node.name] = {name.id for name in ast.walk(node)
                                  if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load)}
    fixed = read_by.get("get_init_inputs", set()) | read_by.get("Model", set())
    return [name for name, (value, _) in _constants(code).items()
            if value > 1 and name in read_by.get("get_inputs", set()) and name not in fixed]


def _set_constant(code: str, name: str, value: int) -> str:
    """``code`` with the literal assigned to ``name`` replaced by ``value`` (nothing else changes)."""
    node = _constants(code)[name][1]
    lines = code.splitlines(keepends=True)
    line = lines[node.lineno - 1]
    lines[node.lineno - 1] = line[:node.col_offset] + str(value) + line[node.end_col_offset:]
    return "".join(lines)


class InputSizer:
    """A worker process that measures and bounds task inputs (it sees no GPU and allocates none).

    Use as a context manager; a task that kills or hangs the worker costs only that task's
    request (a fresh worker takes the next one).
    """

    def __init__(self, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-input-size-"))
        self._worker: WorkerProcess | None = None

    def __enter__(self) -> InputSizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop_worker()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def measure(self, code: str) -> InputSize:
        """As :func:`measure`, in the worker.

        Raises:
            ValueError: the code does not run, or the worker died on it (the message says which).
        """
        reply = self._ask({"op": "measure", "code": code})
        return InputSize(tuple(tuple(shape) for shape in reply["shapes"]), int(reply["nbytes"]))

    def bound(self, code: str, max_bytes: int) -> Bounded:
        """As :func:`bound`, in the worker.

        Raises:
            SizeBoundError: as :func:`bound`.
            ValueError: the code does not run, or the worker died on it.
        """
        reply = self._ask({"op": "bound", "code": code, "max_bytes": max_bytes})
        if "unbounded" in reply:
            raise SizeBoundError(reply["unbounded"])
        scaled = {name: (int(old), int(new)) for name, (old, new) in reply["scaled"].items()}
        return Bounded(reply["code"], int(reply["nbytes"]), int(reply["original_nbytes"]), scaled)

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._worker is None:
            self._worker = WorkerProcess("cuda_agent.synth.input_size", env=child_env({"CUDA_VISIBLE_DEVICES": ""}),
                                         cwd=self._scratch, log_path=self._scratch / "worker.log")
        try:
            return self._worker.request(message, self.timeout_s)
        except RemoteError as exc:
            first_line = exc.detail.strip().splitlines()[0] if exc.detail.strip() else ""
            raise ValueError(f"{exc.error_type}: {first_line}") from None
        except WorkerError as exc:
            self._stop_worker()
            raise ValueError(f"the input-size worker {exc}") from None


def _handle_measure(message: dict[str, Any]) -> dict[str, Any]:
    size = measure(message["code"])
    return {"shapes": [list(shape) for shape in size.shapes], "nbytes": size.nbytes}


def _handle_bound(message: dict[str, Any]) -> dict[str, Any]:
    try:
        bounded = bound(message["code"], int(message["max_bytes"]))
    except SizeBoundError as exc:
        return {"unbounded": str(exc)}
    return {"code": bounded.code, "nbytes": bounded.nbytes, "original_nbytes": bounded.original_nbytes,
            "scaled": {name: list(pair) for name, pair in bounded.scaled.items()}}


if __name__ == "__main__":
    serve({"measure": _handle_measure, "bound": _handle_bound})

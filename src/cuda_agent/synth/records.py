"""The two record types the synthesis pipeline passes between stages.

``SeedOp`` is one mined operator (a row of the seed catalogue); ``TaskRecord`` is one composed
task (a row of the dataset); ``Rejection`` is a task some stage turned down. Both composers, the deterministic one and the LLM one, produce
``TaskRecord``; the filter fills in its timing fields; the writer stores it with the columns of
its core columns (``ops``, ``data_source``, ``code``, ``eager_ms``, ``compile_ms``, ``device``,
``seed_ops_version``, ``id``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

SEED_OPS = "seed_ops.json"
"""File name of the seed-op catalogue a run mines into its dataset directory."""

SEED_OPS_VERSION = "1"
"""Bumped whenever mining changes what it records, so datasets say which catalogue made them."""

FAMILIES = ("activation", "normalization", "convolution", "pooling", "linear", "attention", "mlp",
            "elementwise", "reduction", "linalg", "shape", "loss", "embedding", "other")
"""Operator families used to balance sampling and to count tasks in the dataset card."""

SHAPE_RULES = ("same", "reduce", "expand", "reshape", "scalar")
"""Values of :attr:`SeedOp.shape_rule`."""

_CHOICES = {"kind": ("module", "function"), "source": ("torch", "transformers"), "family": FAMILIES,
            "shape_rule": SHAPE_RULES, "operand": ("same", "transposed")}


@dataclass(frozen=True)
class SeedOp:
    """One operator found by introspection, with what probing it on small tensors showed."""

    name: str
    """Dotted path that imports it: ``torch.nn.Conv2d``, ``torch.nn.functional.gelu``, ..."""
    kind: str
    """``module`` (an ``nn.Module`` class: construct, then call) or ``function``."""
    source: str
    """``torch`` or ``transformers``."""
    family: str
    """One of :data:`FAMILIES`."""
    arity: int
    """Number of tensor inputs the call takes."""
    ranks: tuple[int, ...]
    """Input ranks on which a probe ran successfully."""
    dtypes: tuple[str, ...]
    """Input dtypes on which a probe ran successfully (``float32``, ``float16``, ...)."""
    shape_rule: str
    """What probing showed about the output shape: ``same`` (as the first input), ``reduce``
    (fewer elements, e.g. pooling or a reduction), ``expand`` (more elements), ``reshape`` (as many
    elements in another shape, e.g. a transpose), ``scalar`` (a 0-d tensor)."""
    init: dict[str, Any] = field(default_factory=dict)
    """Constructor kwargs (modules) or extra call kwargs (functions) the probe used. String values
    ``"{dim1}"`` and ``"{last}"`` stand for the first input's size in dim 1 and in its last dim.
    With ``config`` set, ``init["config"]`` holds the kwargs of that config class."""
    signature: str = ""
    """``inspect.signature`` of the constructor (modules) or the function, as text."""
    params: int = 0
    """Parameter count of the probed instance (0 for functions)."""
    stochastic: bool = False
    """Outputs change between calls on the same inputs (dropout, random ops)."""
    inplace: bool = False
    """Writes into its input (``relu_``, ``inplace=True`` variants)."""
    config: str = ""
    """Dotted path of the config class the constructor takes as ``config=`` (transformers blocks),
    built from ``init["config"]``; empty for everything else."""
    output_index: int | None = None
    """``None``: the call returns a tensor; ``k``: it returns a tuple whose item ``k`` is the output
    (``nn.LSTM``, ``torch.topk``, attention blocks that also return weights)."""
    operand: str = "same"
    """Shape of the other tensor inputs: ``same`` as the first, or ``transposed`` (its last two dims
    swapped, as ``torch.matmul`` needs)."""
    square: bool = False
    """Runs only where the first input's last two dims are equal (``torch.linalg.inv``, ...)."""

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"seed op {self.name!r}: field {name!r} is {getattr(self, name)!r}; "
                                 f"expected one of {', '.join(allowed)}")
        if not isinstance(self.arity, int) or self.arity < 1:
            raise ValueError(f"seed op {self.name!r}: field 'arity' is {self.arity!r}; expected an int >= 1")
        if not all(isinstance(rank, int) and rank >= 0 for rank in self.ranks):
            raise ValueError(f"seed op {self.name!r}: field 'ranks' is {self.ranks!r}; expected ints >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeedOp:
        """Raises:
            ValueError: naming the op and the unknown, missing or invalid field.
        """
        fields = dataclasses.fields(cls)
        unknown = sorted(set(data) - {f.name for f in fields})
        if unknown:
            raise ValueError(f"seed op {data.get('name', '?')!r}: unknown field(s) {', '.join(unknown)}")
        missing = [f.name for f in fields if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and f.name not in data]
        if missing:
            raise ValueError(f"seed op {data.get('name', '?')!r}: missing field(s) {', '.join(missing)}")
        values = dict(data)
        values["ranks"] = tuple(values.get("ranks", ()))
        values["dtypes"] = tuple(values.get("dtypes", ()))
        return cls(**values)


@dataclass
class TaskRecord:
    """One composed task: KernelBench-format code plus where it came from and how fast it runs."""

    code: str
    ops: list[str]
    composer: str
    """``deterministic`` or ``llm:<model>``."""
    seed: int
    source: str = "torch"
    """Where the seed operators come from: ``torch`` or ``transformers`` (if any op does)."""
    seed_ops_version: str = SEED_OPS_VERSION
    eager_ms: float | None = None
    compile_ms: float | None = None
    device: str | None = None

    @property
    def id(self) -> str:
        """Content address of the code: the same task always gets the same id."""
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

    @property
    def data_source(self) -> str:
        """CUDA-Agent-Ops-6K style: the seed source and the number of fused operators."""
        return f"{self.source}#{len(self.ops)}"

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["id"], row["data_source"] = self.id, self.data_source
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TaskRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})


@dataclass(frozen=True)
class Rejection:
    """One task id the pipeline turned down, and why (a funnel entry of the card)."""

    id: str
    stage: str
    """Pipeline stage that rejected it (``filter``, ``decontaminate``, ...)."""
    reason: str
    """Named, countable reason (``not_deterministic``, ``benchmark_match``, ...)."""
    detail: str = ""
    """Free text for humans (the matched benchmark file, an error line); never counted."""

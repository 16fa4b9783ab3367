"""The values the forward analysis reasons about: ``Kind``, and the frames and classes that hold them."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

CODE = "torch-compute-fallback"
ENTRY_METHODS = ("forward", "__call__", "_call_impl", "_wrapped_call_impl", "__new__", "__getattr__",
                 "__getattribute__")
MAX_ANALYSES = 4000
# Stream and graph APIs: not compute (the stream-creation guard judges them).
STREAM_PREFIXES = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream",
                   "torch.cuda.StreamContext", "torch.cuda.streams.", "torch.Stream", "torch.cuda.graph",
                   "torch.cuda.CUDAGraph", "torch.cuda.graphs.", "torch.cuda.make_graphed_callables")
MODULE_BASES = ("torch.nn.Module", "torch.nn.modules.module.Module")
AUTOGRAD_FUNCTION = ("torch.autograd.Function", "torch.autograd.function.Function")
NN_MODULE_METHODS = frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
    "named_modules", "state_dict", "register_buffer", "register_parameter", "add_module", "get_parameter",
    "get_buffer", "get_submodule", "train", "eval", "extra_repr"})


class AnalysisBudgetExceeded(RuntimeError):
    """The module's call graph is too large to analyse (a guard error, never a pass)."""


@dataclass(frozen=True)
class Kind:
    """What a Python value is, as far as the guards can tell."""

    tag: str
    """tensor, scalar, ext (the extension), torch / module (an API object, ``ref`` = qualified name), layer
    (a torch.nn layer), func, class, instance, super, container, tuple, builtin, nnmethod, opaque
    (already reported), unknown."""
    ref: Any = None
    """Qualified name, FunctionDef/Lambda, ClassInfo, element Kind (container) or tuple of Kinds."""
    bound: Any = None
    """The receiver a method is bound to (a Kind)."""


T, S, U, X, LAYER = Kind("tensor"), Kind("scalar"), Kind("unknown"), Kind("ext"), Kind("layer")


def tensorish(kind: Kind) -> bool:
    """May be a tensor (deny by default: unknown values count)."""
    return kind.tag in ("tensor", "unknown", "opaque")


def element(kind: Kind) -> Kind:
    """What iterating over or indexing into a value of this kind yields."""
    if kind.tag == "container":
        return kind.ref
    if kind.tag == "tuple":
        out = None
        for k in kind.ref:
            out = join(out, k)
        return out or U
    return kind if kind.tag in ("tensor", "scalar", "layer", "ext", "unknown") else U


def join(a: Kind | None, b: Kind | None) -> Kind:
    """A kind covering both (a name bound on two paths). ``None`` (not yet bound) and scalars (``out =
    None`` before ``out = ext.f(x)``) give way to the other; different kinds otherwise become unknown."""
    if a is None:
        return b or U
    if b is None or a == b:
        return a
    if a.tag == "scalar":
        return b
    if b.tag == "scalar":
        return a
    if a.tag == "tuple" and b.tag == "tuple" and len(a.ref) == len(b.ref):
        return Kind("tuple", tuple(join(x, y) for x, y in zip(a.ref, b.ref)))
    if a.tag in ("tuple", "container") and b.tag in ("tuple", "container"):
        return Kind("container", join(element(a), element(b)))
    return U


class ClassInfo:
    """A class defined in the candidate module."""

    def __init__(self, node: ast.ClassDef) -> None:
        self.node = node
        self.name = node.name
        self.methods = {s.name: s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.class_attrs: dict[str, Kind] = {}
        self.inst_attrs: dict[str, Kind] = {}
        self.local_bases: list[ClassInfo] = []
        self.external_bases: list[Kind] = []

    def mro(self) -> list[ClassInfo]:
        """This class and its local bases, nearest first."""
        out: list[ClassInfo] = []
        stack = [self]
        while stack:
            info = stack.pop(0)
            if info not in out:
                out.append(info)
                stack.extend(info.local_bases)
        return out

    def external(self) -> list[Kind]:
        """Kinds of the bases defined outside the module (``torch.nn.Module``, ``torch.nn.Linear``, ...)."""
        return [b for info in self.mro() for b in info.external_bases]


@dataclass
class Frame:
    """One function being interpreted: its names, its label in messages, and whether to report."""

    env: dict[str, Kind]
    label: str
    silent: bool
    parent: Frame | None = None
    owner: ClassInfo | None = None
    returns: list[Kind] = field(default_factory=list)


OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
             ast.Pow: "**", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitAnd: "&",
             ast.BitXor: "^", ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}
"""Operator symbols for messages."""

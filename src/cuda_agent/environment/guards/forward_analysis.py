"""Abstract interpretation of ``ModelNew.forward``: which values are tensors, and what is done to them.

Each name gets a ``Kind`` (tensor, scalar, the extension, a torch API object, a local function, ...).
Starting from ``forward`` with tensor arguments, every statement is interpreted and every call is
followed into the module's own functions, methods and classes (per argument kinds, memoised). A
PyTorch op outside the allow-list, a tensor method outside the allow-list, or an operator applied
to a tensor is a ``torch-compute-fallback``. Unknown values count as tensors (deny by default).

The same interpreter, run silently over ``__init__`` and the module body, works out what the module's
globals and ``self.<attr>`` hold (the extension, a parameter, an ``nn.Linear``, a constant).
"""

from __future__ import annotations

import ast

from cuda_agent.environment.guards.config import GuardConfig
from cuda_agent.environment.guards.forward_calls import CallResolver
from cuda_agent.environment.guards.forward_kinds import (
    AUTOGRAD_FUNCTION, CODE, ENTRY_METHODS, MODULE_BASES, NN_MODULE_METHODS, OPERATORS, LAYER, S, T, U, X,
    ClassInfo, Frame, Kind, element, join, tensorish,
)
from cuda_agent.environment.guards.python_model import PyModule, snippet
from cuda_agent.environment.guards.vocabulary import TENSOR_SCALAR_ATTRIBUTES, TENSOR_VIEW_ATTRIBUTES
from cuda_agent.environment.solution import EXTENSION_NAME
from cuda_agent.environment.verdict import Violation


class ForwardAnalysis(CallResolver):
    """Runs the interpretation once; ``violations`` and ``reachable`` hold the results."""

    def __init__(self, module: PyModule, config: GuardConfig, custom_op_namespaces: frozenset[str] = frozenset()):
        self.module = module
        self.config = config
        self.custom_op_namespaces = custom_op_namespaces
        self.extra_calls = {c for c in config.extra_allowed_torch_calls if c.startswith("torch.")}
        self.extra_methods = {c.split(".", 1)[1] for c in config.extra_allowed_torch_calls if c.startswith("Tensor.")}
        self.violations: dict[tuple[int, str], Violation] = {}
        self.reachable: dict[int, tuple[ast.AST, str]] = {}
        self._memo: dict[tuple, Kind] = {}
        self._in_progress: set[tuple] = set()
        self._analyses = 0
        self._decorators_checked: set[int] = set()
        self._closures: dict[ast.AST, Frame] = {}
        self.patched_extension: list[ast.expr] = []
        """``ext.name = ...`` targets: replacing an extension function with anything (torch ops)."""
        self.classes = {name: ClassInfo(node) for name, node in module.classes.items()}
        self.module_env: dict[str, Kind] = {}
        self.model_new = self.classes.get("ModelNew")
        self._run()

    # -- driver ------------------------------------------------------------------------------------
    def _run(self) -> None:
        for info in self.classes.values():
            for base in info.node.bases:
                if isinstance(base, ast.Name) and base.id in self.classes and base.id not in self.module.aliases:
                    info.local_bases.append(self.classes[base.id])
                else:
                    qual = self.module.qualname(base)
                    info.external_bases.append(self._qual_kind(qual) if qual else U)
        module_frame = Frame(self.module_env, "<module>", silent=True)
        for _ in range(2):  # twice: globals and self attributes may refer to each other
            self._memo.clear()
            self._exec_block(self.module.tree.body, module_frame)
            for info in self.classes.values():
                for stmt in info.node.body:
                    if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                        value = self._eval(stmt.value, module_frame)
                        for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                            if isinstance(target, ast.Name):
                                info.class_attrs[target.id] = join(info.class_attrs.get(target.id), value)
                for name, method in info.methods.items():
                    default = S if name == "__init__" else U
                    self._call(Kind("func", method, bound=Kind("instance", info)), [], {}, module_frame,
                               default_param=default, silent=True)
        self._memo.clear()
        if self.model_new is not None:
            self._analyse_entry(self.model_new)

    def _analyse_entry(self, info: ClassInfo) -> None:
        for base in info.external():
            if base.tag == "torch" and base.ref not in MODULE_BASES and base.ref.startswith("torch.nn."):
                self._flag(info.node, None, f"ModelNew inherits from {base.ref}, so its forward runs PyTorch "
                                            "compute; subclass torch.nn.Module and call your extension")
        self_kind = Kind("instance", info)
        for name in ENTRY_METHODS:
            found = self._class_lookup(info, name, self_kind)
            if found is None:
                continue
            label = f"ModelNew.{name}"
            if found.tag == "func":
                self._call(found, [], {}, Frame({}, label, silent=False), entry_label=label)
            elif found.tag not in ("nnmethod",):
                self._flag(info.node, None, f"ModelNew.{name} is bound to {self._describe(found)}, not a method "
                                            "the guards can check; define it as a method that calls your extension")

    # -- reporting ---------------------------------------------------------------------------------
    def _flag(self, node: ast.AST, frame: Frame | None, message: str) -> None:
        if frame is not None and frame.silent:
            return
        where = self.module.where(node)
        prefix = f"{frame.label}: " if frame is not None else ""
        key = (getattr(node, "lineno", 0), message.split("(", 1)[0])  # one report per line and kind of problem
        self.violations.setdefault(key, Violation(CODE, f"{where}: {prefix}{message}"))

    def _describe(self, kind: Kind) -> str:
        if kind.tag in ("torch", "module"):
            return kind.ref
        return {"layer": "a torch.nn layer", "tensor": "a tensor", "unknown": "a value of unknown type"}.get(
            kind.tag, kind.tag)

    # -- kinds of names ----------------------------------------------------------------------------
    def _qual_kind(self, qual: str) -> Kind:
        root = qual.split(".")[0]
        if root == "torch":
            return Kind("torch", qual)
        if root == EXTENSION_NAME:
            return X
        return Kind("module", qual)

    def _lookup(self, name: str, frame: Frame) -> Kind:
        f: Frame | None = frame
        while f is not None:
            if name in f.env:
                return f.env[name]
            f = f.parent
        if name in self.module_env:
            return self.module_env[name]
        if name in self.module.aliases:
            return self._qual_kind(self.module.aliases[name])
        return Kind("builtin", name)

    def _bind(self, target: ast.expr, kind: Kind, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            frame.env[target.id] = join(frame.env.get(target.id), kind) if target.id in frame.env else kind
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Starred):
                    self._bind(elt.value, Kind("container", element(kind)), frame)
                elif kind.tag == "tuple" and len(kind.ref) == len(target.elts):
                    self._bind(elt, kind.ref[i], frame)
                else:
                    self._bind(elt, element(kind), frame)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, Kind("container", element(kind)), frame)
        elif isinstance(target, ast.Attribute):
            receiver = self._eval(target.value, frame)
            if receiver.tag == "instance":
                attrs = receiver.ref.inst_attrs
                attrs[target.attr] = join(attrs.get(target.attr), kind)
            elif receiver.tag == "ext":
                self.patched_extension.append(target)  # reported by the monkeypatch guard, even from __init__
            elif receiver.tag == "tensor":
                self._flag(target, frame, f"assigns {snippet(target)} on a tensor, changing it outside your "
                                          "extension; do the work in a kernel")
        elif isinstance(target, ast.Subscript):
            receiver = self._eval(target.value, frame)
            self._eval(target.slice, frame)
            if tensorish(receiver):
                self._flag(target, frame, f"writes {snippet(target)} = ... (an indexed PyTorch copy/fill kernel); "
                                          "write the output in your CUDA extension")

    # -- statements --------------------------------------------------------------------------------
    def _exec_block(self, body: list[ast.stmt], frame: Frame) -> None:
        for stmt in body:
            self._exec(stmt, frame)

    def _exec(self, stmt: ast.stmt, frame: Frame) -> None:  # noqa: C901 - one case per statement type
        if isinstance(stmt, ast.Expr):
            self._eval(stmt.value, frame)
        elif isinstance(stmt, ast.Assign):
            value = self._eval(stmt.value, frame)
            for target in stmt.targets:
                self._bind(target, value, frame)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self._bind(stmt.target, self._eval(stmt.value, frame), frame)
        elif isinstance(stmt, ast.AugAssign):
            current = self._eval(stmt.target, frame)
            value = self._eval(stmt.value, frame)
            result = self._binop(stmt, stmt.op, current, value, frame)
            self._bind(stmt.target, result, frame)
        elif isinstance(stmt, ast.Return):
            value = self._eval(stmt.value, frame) if stmt.value is not None else S
            if stmt.value is not None:
                self._check_passed_value(stmt.value, value, frame)
            frame.returns.append(value)
        elif isinstance(stmt, (ast.If, ast.While)):
            self._eval(stmt.test, frame)
            for _ in range(2 if isinstance(stmt, ast.While) else 1):
                self._exec_block(stmt.body, frame)
            self._exec_block(stmt.orelse, frame)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            items = self._eval(stmt.iter, frame)
            self._bind(stmt.target, element(items), frame)
            for _ in range(2):
                self._exec_block(stmt.body, frame)
            self._exec_block(stmt.orelse, frame)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                self._eval(item.context_expr, frame)
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, S, frame)
            self._exec_block(stmt.body, frame)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self._exec_block(stmt.body, frame)
            for handler in stmt.handlers:
                if handler.name:
                    frame.env[handler.name] = S
                self._exec_block(handler.body, frame)
            self._exec_block(stmt.orelse + stmt.finalbody, frame)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            frame.env[stmt.name] = Kind("func", stmt)
            self._closures[stmt] = frame
        elif isinstance(stmt, ast.ClassDef):
            local = frame.env is self.module_env and stmt.name in self.classes
            frame.env[stmt.name] = Kind("class", self.classes[stmt.name] if local else ClassInfo(stmt))
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                if isinstance(stmt, ast.Import):
                    bound = alias.asname or alias.name.split(".")[0]
                    qual = alias.name if alias.asname else bound
                else:
                    module = "." * (stmt.level or 0) + (stmt.module or "")
                    bound = alias.asname or alias.name
                    qual = module + alias.name if module.endswith(".") else f"{module}.{alias.name}"
                if bound != "*":
                    frame.env[bound] = self._qual_kind(qual)
        elif isinstance(stmt, (ast.Raise, ast.Assert, ast.Delete)):
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.expr):
                    self._eval(child, frame)
        elif isinstance(stmt, ast.Match):
            self._eval(stmt.subject, frame)
            for case in stmt.cases:
                self._exec_block(case.body, frame)

    # -- expressions -------------------------------------------------------------------------------
    def _eval(self, node: ast.expr | None, frame: Frame) -> Kind:  # noqa: C901 - one case per node type
        if node is None:
            return S
        if isinstance(node, ast.Constant):
            return S
        if isinstance(node, ast.Name):
            return self._lookup(node.id, frame)
        if isinstance(node, ast.Attribute):
            return self._attribute(self._eval(node.value, frame), node.attr, node, frame)
        if isinstance(node, ast.Call):
            return self._eval_call(node, frame)
        if isinstance(node, ast.BinOp):
            return self._binop(node, node.op, self._eval(node.left, frame), self._eval(node.right, frame), frame,
                               left_node=node.left)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, frame)
            if isinstance(node.op, ast.Not):
                return S
            if tensorish(operand):
                self._flag(node, frame, f"applies unary '{OPERATORS.get(type(node.op), '?')}' to a tensor "
                                        f"({snippet(node)}); do this arithmetic in your CUDA extension")
                return T
            return operand
        if isinstance(node, ast.Compare):
            kinds = [self._eval(node.left, frame)] + [self._eval(c, frame) for c in node.comparators]
            tensor_op = any(not isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and any(
                tensorish(k) for k in kinds)
            if tensor_op:
                self._flag(node, frame, f"compares tensors ({snippet(node)}), a PyTorch compute op; do it in "
                                        "your CUDA extension")
                return T
            return S
        if isinstance(node, ast.BoolOp):
            out = None
            for value in node.values:
                out = join(out, self._eval(value, frame))
            return out or S
        if isinstance(node, ast.IfExp):
            self._eval(node.test, frame)
            return join(self._eval(node.body, frame), self._eval(node.orelse, frame))
        if isinstance(node, ast.Subscript):
            return self._subscript(node, frame)
        if isinstance(node, ast.Tuple):
            kinds = tuple(self._eval(e, frame) for e in node.elts)
            if any(isinstance(e, ast.Starred) for e in node.elts) or len(kinds) > 16:
                return Kind("container", element(Kind("tuple", kinds)))
            return Kind("tuple", kinds)
        if isinstance(node, (ast.List, ast.Set)):
            out = None
            for e in node.elts:
                out = join(out, self._eval(e, frame))
            return Kind("container", out or U)
        if isinstance(node, ast.Dict):
            out = None
            for k, v in zip(node.keys, node.values):
                self._eval(k, frame)
                out = join(out, self._eval(v, frame))
            return Kind("container", out or U)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = Frame({}, frame.label, frame.silent, parent=frame, owner=frame.owner)
            for gen in node.generators:
                self._bind(gen.target, element(self._eval(gen.iter, inner)), inner)
                for cond in gen.ifs:
                    self._eval(cond, inner)
            if isinstance(node, ast.DictComp):
                self._eval(node.key, inner)
                return Kind("container", self._eval(node.value, inner))
            return Kind("container", self._eval(node.elt, inner))
        if isinstance(node, ast.Lambda):
            self._closures[node] = frame
            return Kind("func", node)
        if isinstance(node, ast.NamedExpr):
            value = self._eval(node.value, frame)
            self._bind(node.target, value, frame)
            return value
        if isinstance(node, ast.Starred):
            return element(self._eval(node.value, frame))
        if isinstance(node, (ast.JoinedStr, ast.FormattedValue)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self._eval(child, frame)
            return S
        if isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                self._eval(part, frame)
            return S
        for child in ast.iter_child_nodes(node):  # Await, Yield, ...: check what is inside
            if isinstance(child, ast.expr):
                self._eval(child, frame)
        return U

    def _binop(self, node: ast.AST, op: ast.operator, left: Kind, right: Kind, frame: Frame,
               left_node: ast.expr | None = None) -> Kind:
        if isinstance(op, ast.Mod) and isinstance(left_node, (ast.Constant, ast.JoinedStr)):
            return S  # "%d" % n: string formatting
        if tensorish(left) or tensorish(right) or isinstance(op, ast.MatMult):
            self._flag(node, frame, f"applies '{OPERATORS.get(type(op), '?')}' to a tensor ({snippet(node)}), a "
                                    "PyTorch compute op; do this arithmetic in your CUDA extension")
            return T
        if left.tag in ("container", "tuple") or right.tag in ("container", "tuple"):
            return Kind("container", join(element(left) if left.tag in ("container", "tuple") else None,
                                          element(right) if right.tag in ("container", "tuple") else None))
        return S

    def _subscript(self, node: ast.Subscript, frame: Frame) -> Kind:
        value = self._eval(node.value, frame)
        index = self._eval(node.slice, frame)
        parts = index.ref if index.tag == "tuple" else (index,)
        if value.tag == "tensor" or (value.tag == "unknown" and any(p.tag == "tensor" for p in parts)):
            if any(tensorish(p) or p.tag == "container" for p in parts):
                self._flag(node, frame, f"indexes a tensor with a tensor or list ({snippet(node)}), a PyTorch "
                                        "gather; do it in your CUDA extension")
            return T
        if value.tag == "tuple" and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
            try:
                return value.ref[node.slice.value]
            except IndexError:
                return U
        if value.tag in ("container", "tuple"):
            return element(value) if not isinstance(node.slice, ast.Slice) else value
        if value.tag in ("scalar", "layer", "ext", "unknown"):
            return value
        return U

    def _attribute(self, receiver: Kind, attr: str, node: ast.AST, frame: Frame) -> Kind:
        tag = receiver.tag
        if tag in ("torch", "module"):
            return Kind(tag, f"{receiver.ref}.{attr}")
        if tag == "ext":
            return X
        if tag in ("tensor", "unknown"):
            if attr in TENSOR_SCALAR_ATTRIBUTES:
                return S
            if attr in TENSOR_VIEW_ATTRIBUTES:
                return T
            return U
        if tag == "layer":
            if attr.startswith(("weight", "bias", "running_", "in_proj_")):
                return T
            return LAYER
        if tag == "instance":
            found = self._class_lookup(receiver.ref, attr, receiver, frame=frame)
            return found if found is not None else U
        if tag == "class":
            found = self._class_lookup(receiver.ref, attr, None, frame=frame)
            return found if found is not None else U
        if tag == "super":
            info: ClassInfo | None = receiver.ref
            if info is not None:
                for base in info.mro()[1:]:
                    found = self._class_lookup(base, attr, receiver.bound, own_only=True, frame=frame)
                    if found is not None:
                        return found
            return Kind("nnmethod", attr) if attr in NN_MODULE_METHODS or attr in ("__init__", "__call__") else U
        if tag == "scalar":
            return S
        return U

    def _class_lookup(self, info: ClassInfo, name: str, instance: Kind | None, own_only: bool = False,
                      frame: Frame | None = None) -> Kind | None:
        for cls in ([info] if own_only else info.mro()):
            if instance is not None and name in cls.inst_attrs:
                return cls.inst_attrs[name]
            if name in cls.methods:
                method = cls.methods[name]
                decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in method.decorator_list}
                if "staticmethod" in decorators or instance is None:
                    return Kind("func", method)
                if "classmethod" in decorators:
                    return Kind("func", method, bound=Kind("class", cls))
                if "property" in decorators:
                    return self._call(Kind("func", method, bound=instance), [], {}, frame,
                                      silent=frame is None or frame.silent)
                return Kind("func", method, bound=instance)
            if name in cls.class_attrs:
                return cls.class_attrs[name]
        if own_only:
            return None
        for base in info.external():
            if base.tag != "torch":
                continue
            if base.ref in AUTOGRAD_FUNCTION and name == "apply":
                forward = self._class_lookup(info, "forward", None)
                return Kind("func", forward.ref, bound=U) if forward is not None and forward.tag == "func" else None
            if base.ref in MODULE_BASES:
                if name == "training":
                    return S
                if name in NN_MODULE_METHODS:
                    return Kind("nnmethod", name)
            elif base.ref.startswith("torch.nn."):
                return self._attribute(LAYER, name, info.node, Frame({}, "", True))
        return None

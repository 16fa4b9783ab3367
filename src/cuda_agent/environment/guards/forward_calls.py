"""How the forward analysis resolves calls: torch APIs, tensor methods, builtins, local functions.

``CallResolver`` is the call half of ``ForwardAnalysis`` (statements and expressions are the other
half, in forward_analysis.py); it only makes sense mixed into that class.
"""

from __future__ import annotations

import ast
import builtins

from cuda_agent.environment.guards.forward_kinds import (
    MAX_ANALYSES, MODULE_BASES, NN_MODULE_METHODS, STREAM_PREFIXES, LAYER, S, T, U, X,
    AnalysisBudgetExceeded, ClassInfo, Frame, Kind, element, join, tensorish,
)
from cuda_agent.environment.guards.python_model import snippet
from cuda_agent.environment.guards.vocabulary import (
    ALLOWED_MODULE_CALLS, ALLOWED_TENSOR_METHODS, ALLOWED_TORCH_CALLS, CONTAINER_METHOD_NAMES, EXTENSION, SCALAR,
    TENSOR, TENSOR_SENSITIVE_BUILTINS, TORCH_VALUE_NAMES, tensor_method_names,
)

_SCALAR_ANNOTATIONS = {"int", "float", "bool", "str", "complex", "None", "tuple", "list", "dict", "Optional", "Union",
                       "Tuple", "List", "Sequence", "Dict", "dtype", "device", "Size"}
_ALLOWED_DECORATORS = {"torch.no_grad", "torch.inference_mode", "functools.wraps", "typing.overload",
                       "torch.jit.ignore", "torch.jit.unused", "torch.compiler.disable"}
# Methods of lists, dicts, strings and autograd contexts: fine on a value of unknown type.
UNTYPED_RECEIVER_METHODS = frozenset({
    "append", "extend", "insert", "pop", "popitem", "get", "items", "keys", "values", "update", "setdefault", "copy",
    "clear", "index", "count", "join", "format", "startswith", "endswith", "strip", "lower", "upper", "encode",
    "decode", "save_for_backward", "mark_dirty", "mark_non_differentiable", "set_materialize_grads",
})
_SAFE_BUILTINS = {"len", "range", "int", "float", "bool", "str", "isinstance", "issubclass", "hasattr", "callable",
                  "id", "hash", "repr", "print", "type", "slice", "format", "ord", "chr", "object", "NotImplemented"}
_CONTAINER_BUILTINS = {"list", "tuple", "set", "frozenset", "dict", "reversed", "iter", "enumerate", "zip"}


class CallResolver:
    """Call resolution for ``ForwardAnalysis`` (which provides ``_eval``, ``_flag``, ``_exec_block``, ...)."""

    # -- calls -------------------------------------------------------------------------------------
    def _eval_call(self, node: ast.Call, frame: Frame) -> Kind:
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = self._eval(func.value, frame)
            args, kwargs = self._eval_args(node, frame)
            return self._method_call(node, receiver, func.attr, args, kwargs, frame)
        if isinstance(func, ast.Name) and self._lookup(func.id, frame) == Kind("builtin", "super"):
            return Kind("super", frame.owner, bound=frame.env.get("self", U))
        callee = self._eval(func, frame)
        args, kwargs = self._eval_args(node, frame)
        return self._call_kind(node, callee, args, kwargs, frame)

    def _eval_args(self, node: ast.Call, frame: Frame) -> tuple[list[Kind], dict[str, Kind]]:
        args = []
        for a in node.args:
            kind = self._eval(a, frame)
            args.append(Kind("container", kind) if isinstance(a, ast.Starred) else kind)
        kwargs = {kw.arg or "**": self._eval(kw.value, frame) for kw in node.keywords}
        introspective = isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "isinstance",
                                                                              "issubclass", "type", "id")
        if not introspective:
            for value, kind in zip([*node.args, *(kw.value for kw in node.keywords)], [*args, *kwargs.values()]):
                self._check_passed_value(value, kind, frame)
        return args, kwargs

    def _check_passed_value(self, node: ast.expr, kind: Kind, frame: Frame) -> None:
        if kind.tag == "torch" and not self._torch_value_ok(kind.ref):
            self._flag(node, frame, f"passes {kind.ref} as a value, so PyTorch would do the compute; call your "
                                    "extension instead")
        elif kind.tag == "func" and not frame.silent:
            self._call(kind, [], {}, frame, default_param=U)  # a callback: it may run with anything

    def _torch_value_ok(self, qual: str) -> bool:
        last = qual.rsplit(".", 1)[-1]
        return (last in TORCH_VALUE_NAMES or qual in ALLOWED_TORCH_CALLS or qual in self.extra_calls
                or self._custom_op(qual) or qual.count(".") == 1 and last in ("cuda", "nn", "ops"))

    def _custom_op(self, qual: str) -> bool:
        parts = qual.split(".")
        return len(parts) >= 3 and parts[:2] == ["torch", "ops"] and parts[2] in self.custom_op_namespaces

    def _method_call(self, node: ast.Call, receiver: Kind, name: str, args: list[Kind], kwargs: dict[str, Kind],
                     frame: Frame) -> Kind:
        tag = receiver.tag
        if tag in ("torch", "module"):
            return self._call_kind(node, Kind(tag, f"{receiver.ref}.{name}"), args, kwargs, frame)
        if tag == "ext":
            return T
        if tag in ("tensor", "unknown"):
            return self._tensor_method(node, receiver, name, frame)
        if tag in ("instance", "class", "super"):
            return self._call_kind(node, self._attribute(receiver, name, node.func, frame), args, kwargs, frame)
        if tag == "layer":
            if name in NN_MODULE_METHODS or name in ("to", "cuda", "cpu", "float", "double", "half"):
                return LAYER
            self._flag(node, frame, f"calls {snippet(node.func)}() on a torch.nn layer, PyTorch compute; "
                                    "implement the layer in your CUDA extension (holding its parameters is fine)")
            return T
        if tag in ("container", "tuple"):
            elem = element(receiver)
            if name in ("pop", "get", "setdefault", "__getitem__"):
                return elem
            if name == "items":
                return Kind("container", Kind("tuple", (S, elem)))
            if name == "values":
                return Kind("container", elem)
            return S if name in ("index", "count", "keys") else receiver
        if tag == "func" and name == "__call__":
            return self._call_kind(node, receiver, args, kwargs, frame)
        if tag == "scalar":
            return S
        return U

    def _tensor_method(self, node: ast.Call, receiver: Kind, name: str, frame: Frame) -> Kind:
        if name in ALLOWED_TENSOR_METHODS:
            return T if ALLOWED_TENSOR_METHODS[name] == TENSOR else S
        if name in self.extra_methods:
            return T
        if receiver.tag == "tensor" or (name in tensor_method_names() and name not in CONTAINER_METHOD_NAMES):
            self._flag(node, frame, f"calls {snippet(node.func)}() on a tensor, a PyTorch op outside the allow-list; "
                                    "compute it in your CUDA extension")
            return T
        if name not in UNTYPED_RECEIVER_METHODS:
            self._flag(node, frame, f"calls {snippet(node.func)}() on a value the guards cannot type (it may be a "
                                    "tensor or a torch module); call your extension on values you made")
            return T
        return U

    def _call_kind(self, node: ast.Call, callee: Kind, args: list[Kind], kwargs: dict[str, Kind],
                   frame: Frame) -> Kind:
        tag = callee.tag
        if tag == "torch":
            return self._torch_call(node, callee.ref, args, frame)
        if tag == "module":
            if callee.ref.startswith(ALLOWED_MODULE_CALLS):
                return args[1] if callee.ref == "typing.cast" and len(args) > 1 else S
            self._flag(node, frame, f"calls {callee.ref}, which the guards cannot verify is not compute; forward "
                                    "may call only your extension (and tensor allocation/metadata)")
            return U
        if tag == "ext":
            return T
        if tag == "func":
            return self._call(callee, args, kwargs, frame)
        if tag == "class":
            info: ClassInfo = callee.ref
            instance = Kind("instance", info)
            init = self._class_lookup(info, "__init__", instance)
            if init is not None and init.tag == "func":
                self._call(init, args, kwargs, frame)
            return instance
        if tag == "instance":
            return self._call_instance(node, callee, args, kwargs, frame)
        if tag == "layer":
            self._flag(node, frame, f"calls the torch.nn layer {snippet(node.func)}, PyTorch compute; implement the "
                                    "layer in your CUDA extension (holding its parameters is fine)")
            return T
        if tag == "builtin":
            return self._builtin_call(node, callee.ref, args, frame)
        if tag == "nnmethod":
            if callee.ref == "get_submodule":
                return LAYER
            return Kind("container", T) if callee.ref.endswith(("parameters", "buffers")) else S
        if tag in ("super", "opaque"):
            return U if tag == "super" else T  # an opaque value was reported where it was made
        self._flag(node, frame, f"calls {snippet(node.func)}, which the guards cannot resolve to your extension or "
                                "an allowed function; call the extension directly")
        return T

    def _call_instance(self, node: ast.Call, callee: Kind, args: list[Kind], kwargs: dict[str, Kind],
                       frame: Frame) -> Kind:
        info: ClassInfo = callee.ref
        for name in ("forward", "__call__"):
            found = self._class_lookup(info, name, callee)
            if found is not None and found.tag == "func":
                return self._call(found, args, kwargs, frame)
        for base in info.external():
            if base.tag == "torch" and base.ref.startswith("torch.nn.") and base.ref not in MODULE_BASES:
                self._flag(node, frame, f"calls {snippet(node.func)}, whose forward is inherited from {base.ref} "
                                        "(PyTorch compute); implement it in your CUDA extension")
                return T
        return U

    def _torch_call(self, node: ast.Call, qual: str, args: list[Kind], frame: Frame) -> Kind:
        if self._custom_op(qual) or qual in self.extra_calls:
            return T
        if qual in ALLOWED_TORCH_CALLS:
            return {TENSOR: T, SCALAR: S, EXTENSION: X}[ALLOWED_TORCH_CALLS[qual]]
        if qual.startswith(STREAM_PREFIXES):
            return S  # the stream-creation guard decides
        if qual.startswith("torch.Tensor."):
            return self._tensor_method(node, args[0] if args else U, qual[len("torch.Tensor."):], frame)
        last = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch.nn.") and last[:1].isupper() and last not in ("Parameter", "Buffer"):
            return LAYER  # building a layer is not compute; calling it is
        self._flag(node, frame, f"calls {qual}, a PyTorch op outside the allow-list; compute it in your CUDA "
                                "extension (allowed torch calls: docs/guards.md)")
        return S if last[:1].isupper() and last not in ("Parameter", "Buffer") else T

    def _builtin_call(self, node: ast.Call, name: str, args: list[Kind], frame: Frame) -> Kind:
        if name in TENSOR_SENSITIVE_BUILTINS:
            if any(tensorish(a) or tensorish(element(a)) and a.tag in ("container", "tuple") for a in args):
                self._flag(node, frame, f"calls {name}() on tensors ({snippet(node)}), which runs PyTorch compute; "
                                        "do it in your CUDA extension")
                return T
            return S
        if name == "getattr":
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                return self._attribute(args[0], node.args[1].value, node, frame)
            self._flag(node, frame, "calls getattr with a computed name, which hides what forward calls; call the "
                                    "extension function by name")
            return Kind("opaque")
        if name in ("map", "filter") and len(args) >= 2:
            result = self._call_kind(node, args[0], [element(a) for a in args[1:]], {}, frame)
            return Kind("container", result if name == "map" else element(args[1]))
        if name in _CONTAINER_BUILTINS:
            if name == "enumerate" and args:
                return Kind("container", Kind("tuple", (S, element(args[0]))))
            if name == "zip":
                return Kind("container", Kind("tuple", tuple(element(a) for a in args)))
            if name == "dict":
                return Kind("container", U)
            return Kind("container", element(args[0])) if args else Kind("container", U)
        if name == "next" and args:
            return element(args[0])
        if name == "type" and len(args) == 1:
            if tensorish(args[0]):
                return Kind("torch", "torch.Tensor")
            return Kind("class", args[0].ref) if args[0].tag == "instance" else S
        if name in _SAFE_BUILTINS or hasattr(builtins, name):
            return S
        self._flag(node, frame, f"calls {snippet(node.func)}, which the guards cannot resolve (not defined in the "
                                "module, not a builtin); call your extension directly")
        return T

    def _call(self, callee: Kind, args: list[Kind], kwargs: dict[str, Kind], frame: Frame | None,
              default_param: Kind = U, silent: bool | None = None, entry_label: str | None = None) -> Kind:
        node = callee.ref
        silent = frame.silent if silent is None and frame is not None else bool(silent)
        if entry_label is not None:
            silent = False
        all_args = ([callee.bound] if callee.bound is not None else []) + list(args)
        key = (node, tuple(all_args), tuple(sorted(kwargs.items(), key=lambda kv: kv[0])), silent, default_param,
               entry_label)
        if key in self._memo:
            return self._memo[key]
        if key in self._in_progress:
            return U
        self._analyses += 1
        if self._analyses > MAX_ANALYSES:
            raise AnalysisBudgetExceeded(f"more than {MAX_ANALYSES} function analyses")
        label = entry_label or self._label(node, frame)
        owner = next((info for info in self.classes.values() if node in info.methods.values()), None)
        parent = self._closures.get(node)
        inner = Frame(self._bind_params(node, all_args, kwargs, default_param, entry_label is not None), label,
                      silent, parent=parent, owner=owner)
        self._in_progress.add(key)
        try:
            if not silent:
                self.reachable[id(node)] = (node, label)
                self._check_decorators(node, inner)
            if isinstance(node, ast.Lambda):
                result = self._eval(node.body, inner)
            else:
                self._exec_block(node.body, inner)
                result = None
                for r in inner.returns:
                    result = join(result, r)
                result = result or S
        finally:
            self._in_progress.discard(key)
        self._memo[key] = result
        return result

    def _label(self, node: ast.AST, frame: Frame | None) -> str:
        name = getattr(node, "name", "<lambda>")
        for info in self.classes.values():
            if node in info.methods.values():
                name = f"{info.name}.{name}"
        caller = frame.label.split(" (")[0] if frame is not None and frame.label != "<module>" else None
        return f"{name} (called from {caller})" if caller and not frame.silent else name

    def _bind_params(self, node: ast.AST, args: list[Kind], kwargs: dict[str, Kind], default: Kind,
                     entry: bool) -> dict[str, Kind]:
        a = node.args
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        env: dict[str, Kind] = {}
        for i, p in enumerate(positional):
            if i < len(args):
                env[p.arg] = args[i]
            elif p.arg in kwargs:
                env[p.arg] = kwargs[p.arg]
            else:
                env[p.arg] = self._param_kind(p, defaults[i], default, entry)
        if a.vararg is not None:
            extra = None
            for k in args[len(positional):]:
                extra = join(extra, element(k) if k.tag == "container" else k)
            env[a.vararg.arg] = Kind("container", extra or (T if entry else default))
        for p, d in zip(a.kwonlyargs, a.kw_defaults):
            env[p.arg] = kwargs.get(p.arg, self._param_kind(p, d, default, entry))
        if a.kwarg is not None:
            env[a.kwarg.arg] = Kind("container", T if entry else U)
        return env

    def _param_kind(self, param: ast.arg, default_value: ast.expr | None, default: Kind, entry: bool) -> Kind:
        if entry:
            return T  # the harness passes whatever get_inputs() makes: annotations and defaults can lie
        annotation = param.annotation
        if annotation is not None:
            names = {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(annotation)}
            names |= {n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant)}
            if "Tensor" not in names and names & _SCALAR_ANNOTATIONS:
                return S
            if "Tensor" in names:
                return T
        if isinstance(default_value, ast.Constant) and default_value.value is not None:
            return S
        return default

    def _check_decorators(self, node: ast.AST, frame: Frame) -> None:
        if id(node) in self._decorators_checked or not hasattr(node, "decorator_list"):
            return
        self._decorators_checked.add(id(node))
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            qual = self.module.qualname(target)
            if qual in _ALLOWED_DECORATORS or any(self.module.is_builtin(target, b) for b in
                                                  ("staticmethod", "classmethod", "property")):
                continue
            kind = self._eval(target, frame)
            if kind.tag == "func" and not isinstance(dec, ast.Call):
                wrapped = self._call(kind, [Kind("func", node)], {}, frame)
                if wrapped.tag == "func":
                    self._call(wrapped, [], {}, frame, default_param=U)
                continue
            self._flag(dec, frame, f"decorator {snippet(dec)} can replace this function with code the guards do "
                                   "not see; remove it")

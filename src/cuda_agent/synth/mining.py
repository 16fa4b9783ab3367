"""Seed mining: find operators in torch (and transformers) by introspection and probe them.

Candidates come from walking namespaces, not from a list of ops: ``torch.nn`` module classes,
the functions of ``torch``, ``torch.nn.functional``, ``torch.special`` and ``torch.linalg``, the
activations of ``transformers.activations.ACT2CLS`` and the blocks defined in the modeling files of
a few common architectures. Arguments come from parameter names (``in_features`` is a size,
``dim`` an axis, ``kernel_size`` 3 or 2, ...). Each candidate is then probed on small random tensors
of ranks 1-4: what runs, on which dtypes, with what output shape, deterministically or not.

Probing runs arbitrary library code on odd inputs, so it runs in worker processes
(``python -m cuda_agent.synth.mining``), one request per candidate with a timeout: a probe that
segfaults or hangs costs that candidate only, and the worker is replaced.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import itertools
import json
import logging
import os
import re
import tempfile
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from cuda_agent.environment.worker import RemoteError, WorkerError, WorkerProcess, child_env, serve
from cuda_agent.python_source import parse_source
from cuda_agent.synth.records import SEED_OPS_VERSION, SeedOp

log = logging.getLogger(__name__)

FUNCTION_NAMESPACES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg")
"""Namespaces whose public functions are candidates (earlier ones win for aliases)."""

ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma", "phi3", "gpt2", "gpt_neox", "bert", "t5", "vit",
                 "mixtral", "olmo")
"""transformers model types whose modeling files are searched for building blocks."""

# Infrastructure rather than compute (global state, I/O, backend-specific internals): probing them
# could change the worker's state for later probes, and they are no seed operators anyway.
_SKIP_PREFIXES = ("set_", "get_", "is_", "use_", "manual_seed", "seed", "initial_seed", "save", "load",
                  "compile", "export", "from_", "sym_", "autocast_", "clear_", "cudnn_", "miopen_",
                  "mkldnn_", "fbgemm_", "native_", "quantize", "q_", "fake_quantize", "vmap", "cond")
_SKIP_MODULES = ("Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
                 "Container")

_PROBE_SHAPES = {1: (8,), 2: (4, 8), 3: (2, 4, 8), 4: (2, 4, 6, 8)}
"""Probe input per rank: dim 1 and the last dim differ, so ``{dim1}`` and ``{last}`` are told apart."""
_SQUARE_SHAPES = {2: (8, 8), 3: (2, 8, 8), 4: (2, 4, 8, 8)}
_DTYPES = (torch.float16, torch.bfloat16)  # float32 is how every probe starts

_ABSENT = object()  # a candidate value meaning "leave the argument at its default"
_SIZE_PLACEHOLDERS = ("{last}", "{dim1}")
"""Placeholders for a feature size: the first input's last dim or its size in dim 1 (channels)."""
_SIZE_ARGS = frozenset({
    "in_features", "out_features", "in1_features", "in2_features", "in_channels", "out_channels",
    "num_features", "num_channels", "embed_dim", "d_model", "input_size", "hidden_size",
    "intermediate_size", "channels", "features", "n_embd", "normalized_shape"})
_ARG_VALUES: dict[str, tuple[Any, ...]] = {
    "dim": (-1, 1), "axis": (-1, 1), "dim0": (-2,), "dim1": (-1,), "dims": ([-1],),
    "kernel_size": (3, 2), "stride": (2,), "padding": (1,), "pad": ([1, 1],), "output_size": (2,),
    "size": (2,), "shape": ([-1],), "num_groups": (2,), "groups": (2,), "num_heads": (2,), "nhead": (2,),
    "n_head": (2,), "upscale_factor": (2,), "downscale_factor": (2,), "scale_factor": (2.0,), "k": (2,),
    "chunks": (2,), "split_size_or_sections": (2,), "sections": (2,), "repeats": (2,), "n": (2,),
    "q": (0.5,), "p": (2.0,), "maxnorm": (1.0,), "lambd": (0.5,), "threshold": (0.1,), "value": (0.0,),
    "min": (-0.5,), "max": (0.5,), "layer_idx": (0,), "num_embeddings": (16,), "norm_type": (2.0,),
}
"""Values to try for an argument by its name, where the argument is required."""
_FILL_IF_NONE = frozenset({"dim", "min", "max", "scale_factor"})
"""Optional arguments that default to ``None`` but are better given (softmax's ``dim``, ...)."""
_CONFIG_VALUES: dict[str, Any] = {
    "hidden_size": "{last}", "n_embd": "{last}", "d_model": "{last}", "intermediate_size": "{last}",
    "n_inner": "{last}", "d_ff": "{last}", "d_kv": "{last}", "moe_intermediate_size": "{last}",
    "num_attention_heads": 2, "n_head": 2, "num_heads": 2, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "n_layer": 1, "num_layers": 1, "max_position_embeddings": 64, "n_positions": 64,
    "num_local_experts": 4, "num_experts_per_tok": 2,
}
"""Small transformers config values; ``*dropout*`` / ``*pdrop*`` are set to 0 so blocks are deterministic."""
_MAX_TEMPLATES = 16
_DOC_SIGNATURE = re.compile(r"^\w+\((?P<args>.*)\)\s*(->.*)?$")

_FAMILY_PATTERNS = (  # (family, regex on the lower-case short name), first match wins
    ("loss", r"loss|cross_entropy|kl_div|^nll"),
    ("mlp", r"mlp|denseact|densegated|intermediate|layerff|moe|experts|feedforward|output$"),
    ("attention", r"attention|^transformer|multihead|block$|layer$"),
    ("embedding", r"embedding"),
    ("convolution", r"conv(?!ert)"),
    ("pooling", r"pool"),
    ("linear", r"^(linear|bilinear|matmul|mm|bmm|addmm|addbmm|baddbmm|addmv|mv|addr|einsum|tensordot|"
               r"inner|outer|ger|dot|vdot|vecdot|chain_matmul)$"),
    ("reduction", r"^(sum|nansum|mean|nanmean|prod|amax|amin|max|min|aminmax|std|var|std_mean|var_mean|"
                  r"logsumexp|norm|dist|median|nanmedian|mode|cumsum|cumprod|cummax|cummin|logcumsumexp|"
                  r"kthvalue|topk|quantile|nanquantile|trace|sort|msort|frobenius_norm|nuclear_norm)$"),
    ("other", r"dropout"),
    ("normalization", r"norm"),
    ("activation", r"relu|^(c|s)?elu_?$|gelu|silu|swish|mish|sigmoid|^tanh_?$|softplus|softsign|softmax|"
                   r"softmin|hardtanh|shrink|threshold|^glu$|expit|activation|laplace"),
    ("linalg", r"^(det|logdet|slogdet|inverse|pinverse|cholesky\w*|svd|qr|lu\w*|triangular_solve|"
               r"matrix_\w+|cross|kron|cdist|pdist|tril|triu|diag\w*)$"),
    ("shape", r"pad|flatten|squeeze|transpose|permute|reshape|view|flip|roll|rot90|shuffle|upsample|"
              r"interpolate|fold|repeat|tile|expand|narrow|chunk|split|movedim|swap|select|gather|ravel|"
              r"pixel"),
)


class MiningError(RuntimeError):
    """Mining could not run at all (a probe worker does not start)."""


class Rejected(Exception):
    """A candidate is not a usable seed operator; the message says why."""


@dataclass(frozen=True)
class Candidate:
    """Something found by introspection, to be probed."""

    name: str
    """Dotted path that imports it."""
    kind: str
    """``module`` or ``function``."""
    source: str
    """``torch`` or ``transformers``."""
    config: str = ""
    """Dotted path of the config class the constructor takes (transformers blocks)."""
    preset: dict[str, Any] = field(default_factory=dict)
    """Constructor kwargs fixed by where it was found (``ACT2CLS`` entries such as ``gelu_10``)."""


@dataclass
class SeedCatalogue:
    """The versioned result of mining: the seed operators and what was left out, and why."""

    ops: list[SeedOp]
    version: str = SEED_OPS_VERSION
    torch_version: str = ""
    transformers_version: str | None = None
    """``None`` when transformers was not mined (not installed, or not asked for)."""
    notes: list[str] = field(default_factory=list)
    """What the catalogue does not cover and why (no transformers, probes that crashed, ...)."""
    rejected: dict[str, str] = field(default_factory=dict)
    """Candidate name -> why probing rejected it."""
    mining_s: float = 0.0


# --------------------------------------------------------------------------- discovery

def import_object(path: str) -> Any:
    """Import a dotted path such as ``torch.nn.functional.gelu`` (longest importable module, then
    attributes).

    Raises:
        ImportError: no prefix of ``path`` imports, or an attribute is missing.
    """
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise ImportError(f"cannot import {path!r}: {'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}") from None
        return obj
    raise ImportError(f"cannot import {path!r}: no module {parts[0]!r}")


def discover_candidates(include_transformers: bool = True) -> tuple[list[Candidate], list[str]]:
    """Every operator candidate, and notes on what could not be searched.

    Returns:
        ``(candidates, notes)``; aliases (the same object under two names) appear once.
    """
    seen: set[int] = set()
    candidates = [*_torch_modules(seen), *_torch_functions(seen)]
    notes: list[str] = []
    if not include_transformers:
        notes.append("transformers not mined (include_transformers=False): the catalogue covers torch only")
        return candidates, notes
    try:
        import transformers  # noqa: F401  (optional extra)
    except ImportError:
        notes.append("transformers is not installed: the catalogue covers torch only "
                     "(pip install transformers to add its activations, norms, MLP and attention blocks)")
        return candidates, notes
    found, more_notes = _transformers_blocks(seen)
    return candidates + found, notes + more_notes


def _torch_modules(seen: set[int]) -> list[Candidate]:
    found = []
    for name in sorted(dir(torch.nn)):
        obj = getattr(torch.nn, name)
        if (inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and name not in _SKIP_MODULES
                and not name.startswith(("_", "Lazy")) and id(obj) not in seen):
            seen.add(id(obj))
            found.append(Candidate(f"torch.nn.{name}", "module", "torch"))
    return found


def _torch_functions(seen: set[int]) -> list[Candidate]:
    found = []
    for namespace in FUNCTION_NAMESPACES:
        module = importlib.import_module(namespace)
        for name in sorted(dir(module)):
            obj = getattr(module, name, None)
            if (name.startswith("_") or name.startswith(_SKIP_PREFIXES) or not callable(obj)
                    or inspect.isclass(obj) or inspect.ismodule(obj) or id(obj) in seen):
                continue
            seen.add(id(obj))
            found.append(Candidate(f"{namespace}.{name}", "function", "torch"))
    return found


def _transformers_blocks(seen: set[int]) -> tuple[list[Candidate], list[str]]:
    from transformers import PreTrainedModel
    from transformers.activations import ACT2CLS
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    found, notes = [], []
    for entry in ACT2CLS.values():
        cls, preset = entry if isinstance(entry, tuple) else (entry, {})
        if cls.__module__.startswith("torch.") or id(cls) in seen:
            continue  # torch classes are mined as torch; one entry per class
        seen.add(id(cls))
        found.append(Candidate(f"{cls.__module__}.{cls.__qualname__}", "module", "transformers", preset=dict(preset)))
    for arch in ARCHITECTURES:
        try:
            modeling = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
            config_cls = CONFIG_MAPPING[arch]
        except (ImportError, KeyError) as exc:
            notes.append(f"transformers architecture {arch!r} skipped: {exc}")
            continue
        config = f"{config_cls.__module__}.{config_cls.__qualname__}"
        for name, obj in sorted(vars(modeling).items()):
            if (inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == modeling.__name__
                    and not issubclass(obj, PreTrainedModel) and id(obj) not in seen):
                seen.add(id(obj))
                takes_config = "config" in inspect.signature(obj.__init__).parameters
                found.append(Candidate(f"{modeling.__name__}.{name}", "module", "transformers",
                                       config=config if takes_config else ""))
    return found, notes


# --------------------------------------------------------------------------- probing (worker side)

def resolve_placeholders(value: Any, shape: tuple[int, ...]) -> Any:
    """Replace ``"{dim1}"`` / ``"{last}"`` (in nested lists and dicts) by sizes of ``shape``.

    Raises:
        IndexError: ``"{dim1}"`` on a rank-1 shape.
    """
    if value == "{dim1}":
        if len(shape) < 2:
            raise IndexError("'{dim1}' needs an input of rank >= 2")
        return shape[1]
    if value == "{last}":
        return shape[-1]
    if isinstance(value, list):
        return [resolve_placeholders(v, shape) for v in value]
    if isinstance(value, dict):
        return {k: resolve_placeholders(v, shape) for k, v in value.items()}
    return value


def instantiate(kind: str, target: Any, init: dict[str, Any], shape: tuple[int, ...],
                config_cls: type | None = None) -> Callable[..., Any]:
    """The callable a seed op stands for on inputs of ``shape``: the module constructed from
    ``init`` (placeholders resolved), or the function with ``init`` bound as keyword arguments."""
    kwargs = resolve_placeholders(init, shape)
    if kind == "function":
        return lambda *tensors: target(*tensors, **kwargs)
    if config_cls is not None:
        kwargs["config"] = config_cls(**kwargs["config"])
    return target(**kwargs)


def probe_candidate(candidate: Candidate) -> SeedOp:
    """Probe one candidate on small tensors and describe what it does.

    Raises:
        Rejected: it cannot be imported, constructed or called on float tensors, or it is no useful
            operator (non-tensor or non-float output, identity, output independent of the input).
    """
    try:
        target = import_object(candidate.name)
        config_cls = import_object(candidate.config) if candidate.config else None
    except ImportError as exc:
        raise Rejected(str(exc)) from None
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        return _Prober(candidate, target, config_cls).run()


@dataclass
class _Trial:
    fn: Callable[..., Any]
    inputs: list[torch.Tensor]
    output: torch.Tensor
    output_index: int | None
    inplace: bool


class _Prober:
    """Search the argument templates, arities and input layouts of one candidate, then measure."""

    def __init__(self, candidate: Candidate, target: Any, config_cls: type | None) -> None:
        self.candidate, self.target, self.config_cls = candidate, target, config_cls
        self.is_module = candidate.kind == "module"
        if self.is_module and not (inspect.isclass(target) and issubclass(target, torch.nn.Module)):
            raise Rejected("not an nn.Module class")
        init_sig = _signature(target.__init__) if self.is_module else None
        call_sig = _signature(target.forward if self.is_module else target)
        shown = init_sig if self.is_module else call_sig
        self.signature = str(shown) if shown else ""
        self.arities, fill = _arguments(init_sig if self.is_module else call_sig, call_sig, self.is_module)
        self.templates = _templates(fill, candidate.preset, self._config_kwargs())

    def _config_kwargs(self) -> dict[str, Any] | None:
        if self.config_cls is None:
            return None
        params = inspect.signature(self.config_cls.__init__).parameters
        kwargs = {name: _CONFIG_VALUES[name] for name in params if name in _CONFIG_VALUES}
        kwargs.update({name: 0.0 for name in params if "dropout" in name or "pdrop" in name})
        kwargs["attn_implementation"] = "eager"  # the plain-torch path, the same on every machine
        return kwargs

    def run(self) -> SeedOp:
        best = self._search()
        if best is None:
            raise Rejected("no probe ran: no rank 1-4, argument template or input layout worked")
        template, arity, operand, square, ranks = best
        top = self._try(template, arity, max(ranks), operand, square, torch.float32)
        inputs, output = top.inputs, top.output
        if self.is_module:
            twin = self._try(template, arity, max(ranks), operand, square, torch.float32)
            if twin is None or not all(_same(a, b) for a, b in zip(top.fn.state_dict().values(),
                                                                   twin.fn.state_dict().values())):
                raise Rejected("uninitialised: two constructions under one seed differ (torch.empty weights)")
        stochastic = not _same(output, self._call(top.fn, inputs))
        if not stochastic and output.shape == inputs[0].shape and _same(output, inputs[0]):
            raise Rejected("identity: the output equals the input")
        if not stochastic:
            other = self._try(template, arity, max(ranks), operand, square, torch.float32, first_seed=1)
            if other is not None and _same(output, other.output):
                raise Rejected("input-independent: the output does not change with the first input's values")
        dtypes = ["float32"] + [str(dt).removeprefix("torch.") for dt in _DTYPES
                                if any(self._try(template, arity, r, operand, square, dt) for r in ranks)]
        rule = _shape_rule(inputs[0], output)
        return SeedOp(
            name=self.candidate.name, kind=self.candidate.kind, source=self.candidate.source,
            family=_family_of(self.candidate.name, self.target, rule), arity=arity, ranks=ranks,
            dtypes=tuple(dtypes), shape_rule=rule, init=template, signature=self.signature,
            params=sum(p.numel() for p in top.fn.parameters()) if self.is_module else 0,
            stochastic=stochastic, inplace=top.inplace, config=self.candidate.config,
            output_index=top.output_index, operand=operand, square=square)

    def _search(self) -> tuple[dict[str, Any], int, str, bool, tuple[int, ...]] | None:
        """The smallest arity that runs (``torch.add`` takes 2, not 3), with the template and operand
        layout that run on the most ranks (ties: the first tried); square inputs only as a fallback."""
        for square, operands in ((False, ("same", "transposed")), (True, ("same",))):
            shapes = _SQUARE_SHAPES if square else _PROBE_SHAPES
            for arity in self.arities:
                best = None
                for operand, template in itertools.product(operands, self.templates):
                    if operand == "transposed" and arity < 2:
                        continue
                    ranks = tuple(r for r in shapes if self._try(template, arity, r, operand, square, torch.float32))
                    if ranks and (best is None or len(ranks) > len(best[4])):
                        best = (template, arity, operand, square, ranks)
                if best is not None:
                    return best
        return None

    def _try(self, template: dict[str, Any], arity: int, rank: int, operand: str, square: bool,
             dtype: torch.dtype, first_seed: int = 0) -> _Trial | None:
        """One call on random inputs (the first drawn with ``first_seed``); ``None`` if it fails."""
        if operand == "transposed" and rank < 2:
            return None
        shape = (_SQUARE_SHAPES if square else _PROBE_SHAPES)[rank]
        generator = torch.Generator().manual_seed(0)
        inputs = [torch.randn(shape, generator=generator).to(dtype)]
        other = shape[:-2] + (shape[-1], shape[-2]) if operand == "transposed" else shape
        inputs += [torch.randn(other, generator=generator).to(dtype) for _ in range(arity - 1)]
        if first_seed:
            inputs[0] = torch.randn(shape, generator=torch.Generator().manual_seed(first_seed)).to(dtype)
        torch.manual_seed(0)  # module initialisation
        scratch = [t.clone() for t in inputs]
        try:
            fn = instantiate(self.candidate.kind, self.target, template, shape, self.config_cls)
            if self.is_module:
                fn = fn.to(dtype)
            output, index = _tensor_output(fn(*scratch))
        except Exception:  # noqa: BLE001 - a probe that raises is just "not accepted"
            return None
        return _Trial(fn, inputs, output, index, inplace=any(not _same(a, b) for a, b in zip(scratch, inputs)))

    @staticmethod
    def _call(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> torch.Tensor:
        """Call again on fresh copies of the inputs.

        Raises:
            Rejected: a second call fails where the first ran.
        """
        try:
            return _tensor_output(fn(*[t.clone() for t in inputs]))[0]
        except Exception as exc:  # noqa: BLE001
            raise Rejected(f"a second call failed: {exc}") from None


def _signature(obj: Any) -> inspect.Signature | None:
    """``inspect.signature``, or where that is missing or only ``(*args, **kwargs)`` (builtins,
    dispatch wrappers), the ``name(args) -> ...`` first line of the docstring."""
    try:
        signature = inspect.signature(obj)
        if any(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values()):
            return signature
    except (TypeError, ValueError):
        signature = None
    first = (getattr(obj, "__doc__", None) or "").lstrip().split("\n", 1)[0]
    match = _DOC_SIGNATURE.match(first)
    if match is None:
        return signature
    try:
        args = parse_source(f"def f({match['args']}): pass").body[0].args
    except SyntaxError:
        return signature
    if args.vararg or args.kwarg:
        return signature
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [inspect.Parameter(a.arg, kind, default=_default(a, d)) for a, d in zip(positional, defaults)]
    params += [inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY, default=_default(a, d))
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    try:
        return inspect.Signature(params)
    except ValueError:
        return signature


def _default(arg: ast.arg, node: ast.expr | None) -> Any:
    """A docstring parameter's default; ``out: Optional[Tensor]`` (no default written) is optional."""
    if node is None:
        optional = arg.annotation is not None and re.search(r"Optional|None", ast.unparse(arg.annotation))
        return None if optional else inspect.Parameter.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...  # a default we cannot evaluate: it exists, that is all that matters


def _arguments(arg_sig: inspect.Signature | None, call_sig: inspect.Signature | None,
               is_module: bool) -> tuple[tuple[int, ...], dict[str, tuple[Any, ...]]]:
    """The arities to try and the values to try per argument, from parameter names.

    For modules ``arg_sig`` is the constructor's (arguments) and ``call_sig`` ``forward``'s (tensor
    inputs); for functions both are the function's: required arguments with no known value are its
    tensor inputs.
    """
    fill: dict[str, tuple[Any, ...]] = {}
    tensors, open_ended = 0, arg_sig is None
    for p in (arg_sig.parameters.values() if arg_sig else ()):
        if p.name in ("self", "config") or p.kind is p.VAR_KEYWORD:
            continue
        if p.kind is p.VAR_POSITIONAL:
            open_ended = True
            continue
        required = p.default is p.empty
        if p.name in _SIZE_ARGS and (required or is_module):
            fill[p.name] = ("size",)
        elif p.name == "dim" and required and is_module:
            fill[p.name] = ("size",)  # a required constructor ``dim`` is a width: GemmaRMSNorm(dim)
        elif p.name in _ARG_VALUES and required:
            fill[p.name] = _ARG_VALUES[p.name]
        elif p.name in _FILL_IF_NONE and p.default is None:
            fill[p.name] = (*_ARG_VALUES[p.name], _ABSENT)
        elif required and (is_module or p.kind is p.KEYWORD_ONLY):
            raise Rejected(f"no value known for required argument {p.name!r}")
        elif required:
            tensors += 1
    if is_module:
        tensors, open_ended = 0, call_sig is None
        for p in (call_sig.parameters.values() if call_sig else ()):
            if p.kind is p.VAR_POSITIONAL:
                open_ended = True
            elif p.name != "self" and p.default is p.empty and p.kind is not p.VAR_KEYWORD:
                tensors += 1
    if open_ended:
        return tuple(range(max(tensors, 1), 4)), fill
    if tensors == 0:
        raise Rejected("takes no tensor input")
    return (tensors,), fill


def _templates(fill: dict[str, tuple[Any, ...]], preset: dict[str, Any],
               config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Argument dicts to try: one value per argument, every size argument on the same placeholder."""
    names = list(fill)
    templates = []
    for size in _SIZE_PLACEHOLDERS:
        for values in itertools.product(*(fill[n] for n in names)):
            template = {}
            for name, value in zip(names, values):
                if value == "size":
                    value = [size] if name == "normalized_shape" else size
                if value is not _ABSENT:
                    template[name] = value
            template.update(preset)
            if config is not None:
                template["config"] = config
            if template not in templates:
                templates.append(template)
    return templates[:_MAX_TEMPLATES]


def _tensor_output(result: Any) -> tuple[torch.Tensor, int | None]:
    """The float tensor a call produced, and its index if the call returned a tuple.

    Raises:
        TypeError: no tensor, not a float tensor, sparse, empty, or no finite value.
    """
    index = None
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], torch.Tensor):
        result, index = result[0], 0
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"returns {type(result).__name__}, not a tensor")
    if not result.is_floating_point() or result.layout is not torch.strided or result.numel() == 0:
        raise TypeError(f"returns a {result.dtype} {result.layout} tensor of {result.numel()} elements")
    if not torch.isfinite(result).any():
        raise TypeError("returns no finite value")
    return result, index


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.nan_to_num(), b.nan_to_num()))


def _shape_rule(first: torch.Tensor, output: torch.Tensor) -> str:
    if output.dim() == 0:
        return "scalar"
    if output.shape == first.shape:
        return "same"
    if output.numel() == first.numel():
        return "reshape"
    return "reduce" if output.numel() < first.numel() else "expand"


def _family_of(name: str, target: Any, shape_rule: str) -> str:
    """The operator family, by rules on the name, the defining module and the shape rule."""
    short = name.rsplit(".", 1)[-1].lower()
    if name.startswith("torch.linalg.") and short not in ("matmul", "vecdot"):
        return "linalg"
    if getattr(target, "__module__", "") in ("torch.nn.modules.activation", "transformers.activations") \
            and "attention" not in short:
        return "activation"
    for family, pattern in _FAMILY_PATTERNS:
        if re.search(pattern, short):
            return family
    if shape_rule == "reshape":
        return "shape"
    return "elementwise" if shape_rule == "same" else "other"


# --------------------------------------------------------------------------- driver (parent side)

def mine_seed_ops(include_transformers: bool = True, progress: Callable[[int, int], None] | None = None,
                  *, workers: int | None = None, timeout_s: float = 30.0) -> SeedCatalogue:
    """Discover and probe every candidate operator.

    Args:
        include_transformers: also mine transformers building blocks (if it is installed).
        progress: called as ``progress(done, total)`` after each candidate, from worker threads.
        workers: probe processes in parallel (default: the CPU count, at most 4).
        timeout_s: time one candidate's probe may take before its worker is killed and it is dropped.

    Raises:
        MiningError: a probe worker does not start.
    """
    started = time.monotonic()
    candidates, notes = discover_candidates(include_transformers)
    workers = workers or min(4, os.cpu_count() or 1)
    ops, rejected = probe_candidates(candidates, workers=workers, timeout_s=timeout_s, progress=progress)
    crashed = sorted(name for name, why in rejected.items() if why.startswith("crashed"))
    if crashed:
        notes.append(f"{len(crashed)} candidate(s) crashed or hung their probe and were dropped: {', '.join(crashed)}")
    transformers_version = None
    if any(c.source == "transformers" for c in candidates):
        import transformers

        transformers_version = transformers.__version__
    return SeedCatalogue(ops=ops, torch_version=torch.__version__, transformers_version=transformers_version,
                         notes=notes, rejected=rejected, mining_s=time.monotonic() - started)


def probe_candidates(candidates: list[Candidate], *, workers: int = 2, timeout_s: float = 30.0,
                     progress: Callable[[int, int], None] | None = None,
                     import_paths: tuple[str, ...] = ()) -> tuple[list[SeedOp], dict[str, str]]:
    """Probe candidates in ``workers`` processes, one request per candidate.

    A candidate whose probe kills or hangs its worker is rejected as ``crashed the probe worker:
    ...`` and a fresh worker takes the rest. ``import_paths`` are added to the workers' ``PYTHONPATH`` (candidates
    from outside the installed packages).

    Returns:
        ``(ops sorted by name, {rejected name: reason})``.
    """
    queue, lock = deque(candidates), threading.Lock()
    ops: list[SeedOp] = []
    rejected: dict[str, str] = {}
    warm = sorted({"transformers"} if any(c.source == "transformers" for c in candidates) else set())
    failures: list[BaseException] = []

    def drive(scratch: Path, index: int) -> None:
        worker = None
        try:
            while True:
                with lock:
                    if not queue or failures:
                        return
                    candidate = queue.popleft()
                if worker is None:
                    worker = _start_worker(scratch, index, warm, import_paths)
                try:
                    reply = worker.request({"op": "probe", "candidate": dataclasses.asdict(candidate)}, timeout_s)
                    outcome = SeedOp.from_dict(reply["seed"]) if "seed" in reply else reply["rejected"]
                except RemoteError as exc:
                    outcome = f"probe raised {exc}"
                except WorkerError as exc:
                    outcome = f"crashed the probe worker: {exc}"
                    log.warning("probing %s: %s", candidate.name, exc)
                    worker.close()
                    worker = None
                with lock:
                    if isinstance(outcome, SeedOp):
                        ops.append(outcome)
                    else:
                        rejected[candidate.name] = outcome
                    if progress is not None:
                        progress(len(ops) + len(rejected), len(candidates))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            with lock:
                failures.append(exc)
        finally:
            if worker is not None:
                worker.close()

    with tempfile.TemporaryDirectory(prefix="cuda-agent-mining-") as scratch:
        threads = [threading.Thread(target=drive, args=(Path(scratch), i), daemon=True)
                   for i in range(max(1, min(workers, len(candidates))))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    return sorted(ops, key=lambda op: op.name), dict(sorted(rejected.items()))


def _start_worker(scratch: Path, index: int, warm: list[str], import_paths: tuple[str, ...]) -> WorkerProcess:
    env = child_env({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "TRANSFORMERS_VERBOSITY": "error"})
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *import_paths])
    worker = WorkerProcess("cuda_agent.synth.mining", env=env, cwd=scratch,
                           log_path=scratch / f"probe-worker-{index}.log", mem_mb=4096)
    try:
        worker.request({"op": "warmup", "modules": warm}, timeout_s=300)
    except (WorkerError, RemoteError) as exc:
        worker.close()
        raise MiningError(f"the probe worker did not start: {exc}\n{getattr(exc, 'log_tail', '')}") from None
    return worker


def _handle_probe(message: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"seed": probe_candidate(Candidate(**message["candidate"])).to_dict()}
    except Rejected as exc:
        return {"rejected": str(exc)}


def _handle_warmup(message: dict[str, Any]) -> dict[str, Any]:
    for module in message["modules"]:
        importlib.import_module(module)
    return {}


# --------------------------------------------------------------------------- catalogue files

def save_catalogue(catalogue: SeedCatalogue, path: str | Path) -> None:
    """Write the catalogue as JSON (ops as :meth:`SeedOp.to_dict` rows)."""
    data = dataclasses.asdict(catalogue)
    data["ops"] = [op.to_dict() for op in catalogue.ops]
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def load_catalogue(path: str | Path) -> SeedCatalogue:
    """Read a catalogue written by :func:`save_catalogue`.

    Raises:
        ValueError: naming the file and the field: unreadable, not JSON, a missing or mistyped
            field, an invalid op, or a catalogue of another ``seed_ops_version``.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read seed catalogue ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON seed catalogue ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a seed catalogue is a JSON object, got {type(data).__name__}")
    expected = {"version": str, "torch_version": str, "notes": list, "rejected": dict, "ops": list,
                "mining_s": (int, float), "transformers_version": (str, type(None))}
    for name, types in expected.items():
        if name not in data:
            raise ValueError(f"{path}: missing field {name!r}")
        if not isinstance(data[name], types):
            raise ValueError(f"{path}: field {name!r} has type {type(data[name]).__name__}")
    unknown = sorted(set(data) - set(expected))
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {', '.join(unknown)}")
    if data["version"] != SEED_OPS_VERSION:
        raise ValueError(f"{path}: field 'version' is {data['version']!r}, but this cuda-agent reads seed "
                         f"catalogues of version {SEED_OPS_VERSION!r}; mine the seeds again")
    ops = []
    for index, row in enumerate(data["ops"]):
        try:
            if not isinstance(row, dict):
                raise ValueError(f"expected an object, got {type(row).__name__}")
            ops.append(SeedOp.from_dict(row))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: field 'ops[{index}]': {exc}") from None
    return SeedCatalogue(**{**data, "ops": ops})


if __name__ == "__main__":
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    serve({"probe": _handle_probe, "warmup": _handle_warmup})

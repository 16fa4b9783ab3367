"""The LLM composer: an OpenAI-compatible chat endpoint fuses sampled seed operators into one task.

The deterministic composer chains operators mechanically; this one asks a model to arrange the same
kind of sample into a layer that looks like real model code (the paper's composer). It talks to any
OpenAI-compatible server (hosted APIs, vLLM, SGLang) through the shared client of
:mod:`cuda_agent.llm`.

Every reply is checked statically (it parses, defines the KernelBench names and uses every
requested operator) and rejected code is sent back with the reason for a repair. The code is never
executed here: running it is the execution filter's job, in a worker process. The client retries
transient failures with backoff and logs every HTTP request with its tokens, latency and cost.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from cuda_agent.environment.task import TaskLoadError, check_source
from cuda_agent.llm import ChatClient, LLMConfig, LLMError, UsageLog
from cuda_agent.python_source import parse_source
from cuda_agent.synth.records import SeedOp, TaskRecord

if TYPE_CHECKING:
    from cuda_agent.synth.mining import SeedCatalogue

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("python", "python3", "py")


class LLMCompositionError(LLMError):
    """The model's replies stayed invalid after every repair round."""


class InvalidComposition(ValueError):
    """One reply's code is not a usable task; the message is fed back to the model."""


SYSTEM_PROMPT = '''\
You write PyTorch benchmark problems in KernelBench format. A problem is one self-contained Python
file that:
- imports torch (`import torch`, `import torch.nn as nn`, `import torch.nn.functional as F`) and,
  only where an operator comes from it, transformers;
- defines module-level integer size constants (`batch_size = 128`, `in_features = 1024`, ...) that
  get_inputs() and get_init_inputs() use;
- defines `class Model(nn.Module)`: `__init__` takes the values get_init_inputs() returns, in that
  order, and creates every submodule and parameter; `forward` takes the tensors get_inputs() returns,
  in that order, and returns one torch.Tensor;
- defines `get_inputs()`, returning a list of float32 CPU tensors made with torch.randn/torch.rand;
- defines `get_init_inputs()`, returning a list of constructor arguments (possibly empty).
Rules: use every listed operator in forward, in the order and with the shapes a real network layer
would; forward must be deterministic (call stochastic operators so that they are, e.g.
training=False or p=0.0); no printing, files, network, threads or `if __name__ == "__main__"`.
Choose sizes so that one forward pass takes about 1-100 ms on a data-centre GPU.
Reply with the complete file in one ```python fenced block.

Example (operators torch.nn.Linear and torch.nn.functional.gelu):
```python
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
in_features = 4096
out_features = 4096


class Model(nn.Module):
    """Linear projection followed by GELU, as in a transformer MLP."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
```'''

_SHAPE_RULES = {"same": "same shape as its first input", "reduce": "fewer elements than its input",
                "expand": "more elements than its input", "reshape": "as many elements in another shape",
                "scalar": "a 0-d tensor"}


def describe_op(op: SeedOp) -> str:
    """One prompt paragraph with what mining learned about ``op``."""
    how = "module: construct in __init__, call in forward" if op.kind == "module" else "function: call in forward"
    lines = [f"{op.name} ({how}; family {op.family})",
             f"  tensor inputs: {op.arity}; input ranks that work: {', '.join(map(str, op.ranks)) or 'any'}; "
             f"dtypes: {', '.join(op.dtypes) or 'float32'}; output: {_SHAPE_RULES[op.shape_rule]}"]
    if op.signature:
        lines.append(f"  signature: {op.name.rsplit('.', 1)[-1]}{op.signature}")
    if op.init:
        init = json.dumps(op.init)
        placeholders = '"{dim1}"' in init or '"{last}"' in init
        note = " ('{dim1}' / '{last}': the first input's size in dim 1 / its last dim)" if placeholders else ""
        lines.append(f"  arguments that worked: {init}{note}")
    if op.config:
        lines.append(f"  takes config={op.config}(**arguments['config'])")
    if op.output_index is not None:
        lines.append(f"  returns a tuple: use item {op.output_index}")
    if op.operand == "transposed":
        lines.append("  its other tensor inputs have the first input's last two dims swapped")
    if op.square:
        lines.append("  needs the first input's last two dims equal")
    if op.stochastic:
        lines.append("  stochastic: call it deterministically")
    return "\n".join(lines)


def build_messages(ops: Sequence[SeedOp]) -> list[dict[str, str]]:
    """The system prompt and the request to fuse ``ops`` into one layer."""
    listing = "\n".join(f"{i}. {describe_op(op)}" for i, op in enumerate(ops, start=1))
    names = ", ".join(_short_name(op) for op in ops)
    user = (f"Compose these {len(ops)} operator(s) into one realistic fused layer, as they would appear "
            f"together in a real model:\n\n{listing}\n\nUse each of them by name ({names}) at least once.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def extract_code(text: str) -> str:
    """The last ```python fenced block of ``text``, else its last untagged block, else all of it."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    for wanted in (_PYTHON_TAGS, ("",)):
        found = [body for tag, body in blocks if tag in wanted]
        if found:
            return found[-1].strip() + "\n"
    return text.strip() + "\n"


def validate(code: str, ops: Sequence[SeedOp]) -> None:
    """Check ``code`` statically: it parses, is a KernelBench problem and uses every op by name.

    Raises:
        InvalidComposition: with a reason written for the model to act on.
    """
    try:
        check_source(code, "your code")
    except TaskLoadError as exc:
        raise InvalidComposition(str(exc)) from None
    tree = parse_source(code)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None or not any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in model.body):
        raise InvalidComposition("your code: Model must be a top-level class with a forward method")
    used = _referenced_names(tree)
    missing = [op.name for op in ops if _short_name(op) not in used]
    if missing:
        raise InvalidComposition(f"your code does not use {', '.join(missing)}; call every listed operator "
                                 "by its name in Model")


def _short_name(op: SeedOp) -> str:
    return op.name.rsplit(".", 1)[-1]


def _referenced_names(tree: ast.AST) -> set[str]:
    """Identifiers code refers to (names, attributes, imports); comments and strings do not count."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
    return names


class LLMComposer:
    """Compose one task per call through a :class:`ChatClient`, repairing invalid replies."""

    def __init__(self, config: LLMConfig, usage: UsageLog | None = None) -> None:
        self.config = config
        self.client = ChatClient(config, usage)

    @property
    def usage(self) -> UsageLog:
        return self.client.usage

    def compose(self, ops: Sequence[SeedOp], seed: int) -> TaskRecord:
        """Ask for a task fusing ``ops`` (1-5 seed operators), sampled with ``seed``.

        Raises:
            LLMEndpointError: the endpoint failed (see :meth:`ChatClient.complete`).
            LLMCompositionError: the code was still invalid after ``max_repairs`` repairs.
            ValueError: ``ops`` is empty.
        """
        if not ops:
            raise ValueError("llm: ops is empty; the composer needs 1-5 seed operators")
        messages = build_messages(ops)
        for round_ in range(self.config.max_repairs + 1):
            reply = self.client.complete(messages, seed)
            code = extract_code(reply.content)
            try:
                if reply.finish_reason == "length":
                    raise InvalidComposition(f"your reply was cut off at max_tokens={self.config.max_tokens}; "
                                             "write a shorter file")
                validate(code, ops)
            except InvalidComposition as exc:
                reason = str(exc)
                logger.info("llm: seed %d round %d rejected: %s", seed, round_ + 1, reason)
                messages = [*messages, {"role": "assistant", "content": reply.content},
                            {"role": "user", "content": f"The file was rejected: {reason}. Reply with the "
                                                        "corrected complete file in one ```python block."}]
                continue
            source = "transformers" if any(op.source == "transformers" for op in ops) else "torch"
            return TaskRecord(code=code, ops=[op.name for op in ops], composer=f"llm:{self.config.model}",
                              seed=seed, source=source)
        raise LLMCompositionError(f"llm: no valid task for seed {seed} after {self.config.max_repairs + 1} "
                                  f"replies (max_repairs={self.config.max_repairs}); last reason: {reason}")


class SampledChainComposer:
    """``seed -> TaskRecord``: the LLM composes the operators the deterministic composer samples
    for that seed, so both composers draw from the same compatible chains."""

    parallel: ClassVar[str] = "threads"
    """How the pipeline runs several at once: the work is waiting on the endpoint."""

    def __init__(self, catalogue: SeedCatalogue, config: LLMConfig, n_ops: int | None = None,
                 usage: UsageLog | None = None) -> None:
        self.catalogue, self.n_ops = catalogue, n_ops
        self.composer = LLMComposer(config, usage)
        self._by_name = {op.name: op for op in catalogue.ops}
        self._sampling = threading.Lock()  # sampling forks torch's global RNG: one thread at a time

    def __call__(self, seed: int) -> TaskRecord:
        from cuda_agent.synth.composer import compose  # torch; only when an LLM composes

        with self._sampling:
            names = compose(self.catalogue, seed, self.n_ops).ops
        return self.composer.compose([self._by_name[name] for name in names], seed)


@dataclass(frozen=True)
class ComposeResult:
    """Outcome of one :func:`compose_many` item: a record, or why there is none."""

    index: int
    seed: int
    record: TaskRecord | None
    error: str | None


def compose_many(op_lists: Iterable[Sequence[SeedOp]], seeds: Iterable[int], config: LLMConfig,
                 usage: UsageLog | None = None) -> Iterator[ComposeResult]:
    """Compose one task per ``(ops, seed)`` pair with ``config.concurrency`` requests in flight.

    Results come in input order. Closing the iterator early cancels the requests not yet started.

    Args:
        op_lists: per task, the sampled seed operators (1-5).
        seeds: per task, the sampling seed; must have as many items as ``op_lists``.
        usage: where to count tokens and cost (default: a new log at ``config.usage_log``).

    Raises:
        ValueError: ``op_lists`` and ``seeds`` differ in length (before any request is sent).
    """
    pairs = list(zip(op_lists, seeds, strict=True))
    composer = LLMComposer(config, usage)

    def attempt(index: int, ops: Sequence[SeedOp], seed: int) -> ComposeResult:
        try:
            return ComposeResult(index, seed, composer.compose(ops, seed), None)
        except (LLMError, ValueError) as exc:
            return ComposeResult(index, seed, None, str(exc))

    with ThreadPoolExecutor(config.concurrency, thread_name_prefix="llm-composer") as pool:
        futures = [pool.submit(attempt, index, ops, seed) for index, (ops, seed) in enumerate(pairs)]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()

"""The LLM composer: an OpenAI-compatible chat endpoint fuses sampled seed operators into one task.

The deterministic composer chains operators mechanically; this one asks a model to arrange the same
kind of sample into a layer that looks like real model code (the paper's composer). It speaks the
chat-completions protocol (``POST {base_url}/chat/completions``) with the standard library, so it
works against any OpenAI-compatible server (hosted APIs, vLLM, SGLang) without an extra dependency.

Every reply is checked statically (it parses, defines the KernelBench names and uses every
requested operator) and rejected code is sent back with the reason for a repair. The code is never
executed here: running it is the execution filter's job, in a worker process. Transient failures
(HTTP 429 and 5xx, timeouts, dropped connections) are retried with exponential backoff, and every
HTTP request is written to a JSONL usage log with its tokens, latency and cost.
"""

from __future__ import annotations

import ast
import http.client
import json
import logging
import os
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cuda_agent.environment.task import TaskLoadError, check_source
from cuda_agent.synth.records import SeedOp, TaskRecord

if TYPE_CHECKING:
    from cuda_agent.synth.mining import SeedCatalogue

logger = logging.getLogger(__name__)

ENV_BASE_URL = ("CUDA_AGENT_LLM_BASE_URL", "OPENAI_BASE_URL")
ENV_MODEL = ("CUDA_AGENT_LLM_MODEL",)
ENV_API_KEY = ("CUDA_AGENT_LLM_API_KEY", "OPENAI_API_KEY")
"""Environment variables read by :meth:`LLMConfig.from_env`, first match wins."""

_RETRYABLE_HTTP = frozenset({408, 409, 429})
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("python", "python3", "py")


class LLMError(RuntimeError):
    """The LLM composer could not produce a task (the pipeline counts it as a compose rejection)."""


class LLMEndpointError(LLMError):
    """The endpoint refused the request, or kept failing after every retry."""


class LLMCompositionError(LLMError):
    """The model's replies stayed invalid after every repair round."""


class InvalidComposition(ValueError):
    """One reply's code is not a usable task; the message is fed back to the model."""


@dataclass(frozen=True)
class LLMConfig:
    """Endpoint, sampling and budget settings of the LLM composer."""

    base_url: str
    """Endpoint root, up to and including the API version: ``https://api.openai.com/v1``,
    ``http://localhost:8000/v1`` (vLLM). ``/chat/completions`` is appended."""
    model: str
    """Model name sent in each request; the record's composer is ``llm:<model>``."""
    api_key: str = field(default="", repr=False)
    """Sent as ``Authorization: Bearer <key>``; empty sends no header (local servers)."""
    temperature: float = 0.7
    max_tokens: int = 4096
    """Completion budget per reply; a reply cut at it is rejected and repaired."""
    timeout_s: float = 120.0
    """Limit for connecting and for each read from the endpoint; a timeout is retried."""
    max_retries: int = 4
    """Retries of one request after HTTP 408/409/429/5xx, a timeout or a dropped connection."""
    max_repairs: int = 2
    """Times invalid code is sent back with the reason before the task is given up."""
    concurrency: int = 4
    """Requests in flight at once in :func:`compose_many`."""
    backoff_s: float = 1.0
    """Wait before the first retry; doubled on each further retry (plus up to 25% jitter)."""
    max_backoff_s: float = 60.0
    """Cap on one wait, including a server's ``Retry-After``."""
    usage_log: Path | None = None
    """JSONL file that gets one line per HTTP request (appended); ``None`` keeps totals only."""
    usd_per_mtok_prompt: float = 0.0
    """Price of a million prompt tokens, for the ``cost_usd`` of each request and the totals."""
    usd_per_mtok_completion: float = 0.0
    """Price of a million completion tokens."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"llm: base_url is {self.base_url!r}; expected an http(s) URL such as "
                             f"http://localhost:8000/v1 (argument, or env {' / '.join(ENV_BASE_URL)})")
        if not self.model:
            raise ValueError(f"llm: model is empty; pass one or set {ENV_MODEL[0]}")
        if self.temperature < 0:
            raise ValueError(f"llm: temperature must be >= 0, got {self.temperature}")
        for name in ("max_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"llm: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_retries", "max_repairs", "backoff_s", "max_backoff_s",
                     "usd_per_mtok_prompt", "usd_per_mtok_completion"):
            if getattr(self, name) < 0:
                raise ValueError(f"llm: {name} must be >= 0, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"llm: timeout_s must be > 0, got {self.timeout_s}")
        if self.usage_log is not None:
            object.__setattr__(self, "usage_log", Path(self.usage_log))

    @classmethod
    def from_env(cls, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 env: Mapping[str, str] | None = None, **settings: Any) -> LLMConfig:
        """Build a config from explicit values, falling back to the environment.

        Args:
            base_url, model, api_key: explicit values; ``None`` reads :data:`ENV_BASE_URL`,
                :data:`ENV_MODEL`, :data:`ENV_API_KEY` (first set variable wins).
            env: the environment to read (default ``os.environ``).
            settings: any other :class:`LLMConfig` field.

        Raises:
            ValueError: naming the missing setting and the variables that could provide it.
        """
        env = os.environ if env is None else env

        def pick(value: str | None, names: tuple[str, ...]) -> str:
            return value if value is not None else next((env[n] for n in names if env.get(n)), "")

        return cls(base_url=pick(base_url, ENV_BASE_URL).rstrip("/"), model=pick(model, ENV_MODEL),
                   api_key=pick(api_key, ENV_API_KEY), **settings)


@dataclass(frozen=True)
class ChatReply:
    """The part of a chat completion the composer uses."""

    content: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class UsageTotals:
    """Running totals over every HTTP request a :class:`UsageLog` has seen."""

    requests: int = 0
    failed_requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0


class UsageLog:
    """Per-request JSONL log plus running totals; safe to share between threads."""

    def __init__(self, path: str | Path | None = None, usd_per_mtok_prompt: float = 0.0,
                 usd_per_mtok_completion: float = 0.0) -> None:
        self.path = None if path is None else Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._prices = (usd_per_mtok_prompt, usd_per_mtok_completion)
        self._totals = UsageTotals()
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, config: LLMConfig) -> UsageLog:
        return cls(config.usage_log, config.usd_per_mtok_prompt, config.usd_per_mtok_completion)

    def record(self, *, model: str, seed: int, attempt: int, status: str, latency_s: float,
               prompt_tokens: int = 0, completion_tokens: int = 0, error: str = "") -> None:
        """Count one HTTP request and append its line.

        Args:
            attempt: 1 for the first try of a request, 2.. for its retries.
            status: ``ok``, ``http_<code>``, ``timeout``, ``connection_error`` or ``bad_response``.
            latency_s: seconds from sending the request to the reply or the failure.
        """
        cost = (prompt_tokens * self._prices[0] + completion_tokens * self._prices[1]) / 1e6
        line = {"timestamp": datetime.now(timezone.utc).isoformat(), "model": model, "seed": seed,
                "attempt": attempt, "status": status, "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens,
                "latency_s": latency_s, "cost_usd": cost, "error": error}
        with self._lock:
            totals = self._totals
            totals.requests += 1
            totals.failed_requests += status != "ok"
            totals.prompt_tokens += prompt_tokens
            totals.completion_tokens += completion_tokens
            totals.cost_usd += cost
            totals.latency_s += latency_s
            if self.path is not None:
                with self.path.open("a") as log:
                    log.write(json.dumps(line) + "\n")

    @property
    def totals(self) -> UsageTotals:
        with self._lock:
            return replace(self._totals)


class _RequestFailed(Exception):
    """One HTTP request failed; ``status`` goes to the usage log, ``retryable`` decides what next."""

    def __init__(self, status: str, message: str, retryable: bool, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.retryable, self.retry_after_s = status, retryable, retry_after_s


class ChatClient:
    """Chat-completions requests with retries, backoff and usage logging."""

    def __init__(self, config: LLMConfig, usage: UsageLog | None = None) -> None:
        self.config = config
        self.usage = usage if usage is not None else UsageLog.for_config(config)
        self.url = config.base_url.rstrip("/") + "/chat/completions"

    def complete(self, messages: list[dict[str, str]], seed: int) -> ChatReply:
        """Send ``messages``; retry transient failures up to ``max_retries`` times.

        Raises:
            LLMEndpointError: a non-retryable status (e.g. 400, 401), a malformed reply, or the
                last retry failing; the message names the URL, the status and the attempts.
        """
        cfg = self.config
        for attempt in range(1, cfg.max_retries + 2):
            start = time.monotonic()
            try:
                reply = self._post(messages, seed)
            except _RequestFailed as exc:
                self._log(seed, attempt, exc.status, start, error=str(exc))
                if not exc.retryable:
                    raise LLMEndpointError(f"llm: {exc}") from None
                if attempt > cfg.max_retries:
                    raise LLMEndpointError(f"llm: {self.url} failed {attempt} times (max_retries="
                                           f"{cfg.max_retries}); last error: {exc}") from None
                delay = min(max(cfg.backoff_s * 2 ** (attempt - 1), exc.retry_after_s)
                            * (1 + 0.25 * random.random()), cfg.max_backoff_s)
                logger.info("llm: %s (attempt %d); retrying in %.2f s", exc, attempt, delay)
                time.sleep(delay)
            else:
                self._log(seed, attempt, "ok", start, reply.prompt_tokens, reply.completion_tokens)
                return reply
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _log(self, seed: int, attempt: int, status: str, start: float, prompt_tokens: int = 0,
             completion_tokens: int = 0, error: str = "") -> None:
        self.usage.record(model=self.config.model, seed=seed, attempt=attempt, status=status,
                          latency_s=time.monotonic() - start, prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens, error=error)

    def _post(self, messages: list[dict[str, str]], seed: int) -> ChatReply:
        cfg = self.config
        body = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature,
                "max_tokens": cfg.max_tokens, "seed": seed}
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _http_failure(exc, self.url) from None
        except (OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise _RequestFailed("timeout", f"no reply from {self.url} within timeout_s={cfg.timeout_s}",
                                     retryable=True) from None
            raise _RequestFailed("connection_error", f"cannot reach {self.url}: {reason}", retryable=True) from None
        return _parse_reply(raw, self.url)


def _http_failure(exc: urllib.error.HTTPError, url: str) -> _RequestFailed:
    """Retryable for 408/409/429/5xx (honouring ``Retry-After``), final for the rest."""
    detail = exc.read().decode(errors="replace")[:500]
    try:
        detail = json.loads(detail)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    message = f"HTTP {exc.code} from {url}: {detail}"
    if exc.code in (401, 403):
        message += f" (check the API key: argument or env {' / '.join(ENV_API_KEY)})"
    retryable = exc.code in _RETRYABLE_HTTP or exc.code >= 500
    try:
        retry_after_s = float(exc.headers.get("Retry-After", 0))
    except ValueError:
        retry_after_s = 0.0
    return _RequestFailed(f"http_{exc.code}", message, retryable, retry_after_s)


def _parse_reply(raw: bytes, url: str) -> ChatReply:
    try:
        payload = json.loads(raw)
        choice = payload["choices"][0]
        usage = payload.get("usage") or {}
        return ChatReply(content=choice["message"].get("content") or "",
                         finish_reason=choice.get("finish_reason") or "",
                         prompt_tokens=int(usage.get("prompt_tokens", 0)),
                         completion_tokens=int(usage.get("completion_tokens", 0)))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise _RequestFailed("bad_response", f"{url} sent no chat completion (expected choices[0].message; "
                             f"{type(exc).__name__}: {exc}): {raw[:200]!r}", retryable=False) from None


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
    tree = ast.parse(code)
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

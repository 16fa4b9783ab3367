"""Detecting tampering with the harness from inside the candidate's own process.

The candidate worker runs untrusted code next to the harness functions that time it and save its
outputs. Before any candidate code is imported, a snapshot records every harness-critical function
and its code object; after each candidate call the snapshot is compared again. This catches
monkeypatching of ``torch.cuda.synchronize``, the timers, the output sharing, the runtime checks or
``time``, and rebinding of any name in the worker's own module namespace (it runs as
``__main__``, so watching the importable module alone would miss ``__main__.measure = ...``). The
static guards reject the introspection tricks needed to reach further; the sandbox, the audited
timed calls and the reply nonce do not depend on this process at all.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from cuda_agent.environment.thread_starts import START_FUNCTIONS

_WATCHED = (
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "monotonic"), ("time", "sleep"),
    ("torch", "equal"), ("torch", "isnan"), ("torch.cuda", "synchronize"), ("torch.cuda", "Event"),
    ("torch.cuda", "current_stream"), ("torch", "no_grad"),
    ("cuda_agent.environment.shared_tensors", "share"), ("cuda_agent.environment.shared_tensors", "open_share"),
    ("cuda_agent.environment.shared_tensors", "OutgoingShare"), ("cuda_agent.environment.shared_tensors", "dtype_name"),
    ("cuda_agent.environment.shared_tensors", "flat_bytes"),
    ("cuda_agent.environment.fingerprint", "FingerprintKey"), ("cuda_agent.environment.fingerprint", "flat_bytes"),
    ("cuda_agent.environment.timing", "measure"), ("cuda_agent.environment.timing", "summarize"),
    ("cuda_agent.environment.timing", "CudaTimer"), ("cuda_agent.environment.timing", "CpuTimer"),
    ("cuda_agent.environment.candidate_worker", "runtime_violations"),
    ("cuda_agent.environment.thread_starts", "ThreadStartLog"),
    ("cuda_agent.environment.worker", "serve"), ("cuda_agent.environment.worker", "_write_all"),
    ("builtins", "open"), ("builtins", "isinstance"), ("builtins", "type"), ("builtins", "len"),
    ("json", "dumps"), ("os", "write"),
)
_WATCHED_METHODS = (
    ("Tensor", ("__eq__", "__ne__", "untyped_storage", "clone", "data_ptr", "storage_offset", "numel",
                "element_size", "is_floating_point", "all", "any")),
    ("UntypedStorage", ("nbytes", "data_ptr")),
)


def _code_of(obj: Any) -> list[Any]:
    """The code objects behind a function or class (its methods), to detect ``__code__`` swaps."""
    if hasattr(obj, "__code__"):
        return [obj.__code__]
    if isinstance(obj, type):
        return [v.__code__ for v in vars(obj).values() if hasattr(v, "__code__")]
    return []


class HarnessSnapshot:
    """Identities of the watched functions and their code objects at capture time."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        """``namespace``: the running worker's module globals; every function, class and module
        bound there is watched too."""
        import torch

        self._entries: list[tuple[str, Any, Any, list[Any]]] = []
        for module_name, attr in _WATCHED:
            module = importlib.import_module(module_name)
            self._watch(f"{module_name}.{attr}", module, attr)
        for cls_name, attrs in _WATCHED_METHODS:
            for attr in attrs:
                self._watch(f"torch.{cls_name}.{attr}", getattr(torch, cls_name), attr)
        for module, attr in START_FUNCTIONS:  # the stamping wrappers, when installed first
            if hasattr(module, attr):
                self._watch(f"{module.__name__}.{attr}", module, attr)
        self._namespace = namespace
        self._bindings = {k: v for k, v in namespace.items()
                          if (callable(v) or isinstance(v, ModuleType)) and not k.startswith("__")}

    def _watch(self, name: str, owner: Any, attr: str) -> None:
        obj = getattr(owner, attr)
        self._entries.append((name, owner, obj, _code_of(obj)))

    def changed(self) -> list[str]:
        """Names of watched functions that were replaced or whose code was swapped."""
        changed = []
        for name, owner, obj, codes in self._entries:
            attr = name.rsplit(".", 1)[1]
            current = getattr(owner, attr, None)
            if current is not obj or _code_of(obj) != codes:
                changed.append(name)
        changed += [f"__main__.{k}" for k, v in self._bindings.items() if self._namespace.get(k) is not v]
        return changed

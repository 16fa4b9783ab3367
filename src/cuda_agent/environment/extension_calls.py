"""Counting calls into the candidate's compiled extension (runtime guard ``no-custom-kernel``).

A candidate that passes correctness without calling its own kernels computes the answer some other
way (a torch fallback the static guards missed, an analytical shortcut with allowed tensor
creation ops). Before any candidate code is imported, the candidate worker makes
``torch.utils.cpp_extension.load_inline``/``load`` return counting proxies of the built modules and
pre-imports the workdir's ``cuda_extension`` as one; a forward pass that leaves the count unchanged
is a violation.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, Callable

from cuda_agent.environment.prebuilt import prebuilt_loader


class ExtensionCallCounter:
    """Wraps every callable of each extension module the candidate loads and counts calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.modules: list[str] = []
        self.extensions_dir: Path | None = None
        """Where the build put the candidate's extensions (set before the candidate is imported)."""

    def install(self) -> None:
        """Route torch's JIT extension builders through :meth:`wrap` (candidate worker only): they
        import what the protected build compiled (:func:`prebuilt.prebuilt_loader`)."""
        import torch.utils.cpp_extension as cpp_extension

        for name in ("load_inline", "load"):
            loader = prebuilt_loader(name, getattr(cpp_extension, name), lambda: self.extensions_dir)
            cpp_extension.__dict__[name] = self._wrapping(loader)

    def preload(self, module_name: str) -> None:
        """Import ``module_name`` now and register its counting proxy in ``sys.modules``."""
        import importlib

        sys.modules[module_name] = self.wrap(importlib.import_module(module_name))

    def _wrapping(self, builder: Callable[..., Any]) -> Callable[..., Any]:
        def build_and_wrap(*args: Any, **kwargs: Any) -> Any:
            built = builder(*args, **kwargs)
            return self.wrap(built) if isinstance(built, types.ModuleType) else built

        return build_and_wrap

    def wrap(self, module: types.ModuleType) -> types.ModuleType:
        proxy = types.ModuleType(module.__name__, module.__doc__)
        for attr, value in vars(module).items():
            if callable(value) and not isinstance(value, type) and not attr.startswith("__"):
                value = self._counting(value)
            setattr(proxy, attr, value)
        self.modules.append(module.__name__)
        return proxy

    def _counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return fn(*args, **kwargs)

        counted.__name__ = getattr(fn, "__name__", "extension_function")
        counted.__doc__ = getattr(fn, "__doc__", None)
        return counted

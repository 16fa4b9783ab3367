"""The static guards, their registry, and the one entry point ``run_static_guards``.

Each guard owns one violation code and checks both languages where the code applies to both
(``concurrency`` covers ``threading`` in Python and ``std::thread`` in C++).
"""

from __future__ import annotations

import logging
from typing import Callable

from cuda_agent.environment.guards import cpp_rules, python_rules
from cuda_agent.environment.guards.base import SourceBundle, StaticGuard
from cuda_agent.environment.guards.config import GuardConfig
from cuda_agent.environment.guards.cpp_model import CppUnit
from cuda_agent.environment.guards.cpp_rules import CppContext
from cuda_agent.environment.guards.forward_analysis import ForwardAnalysis
from cuda_agent.environment.guards.python_model import PyModule
from cuda_agent.environment.launchers import COMPILED_SUFFIXES, includes_launcher_header
from cuda_agent.environment.solution import Solution
from cuda_agent.environment.verdict import Violation
from cuda_agent.registry import Registry

logger = logging.getLogger(__name__)

MAX_REPORTS_PER_CODE = 20
"""Violations reported per code; the rest are counted in one final line."""

PythonCheck = Callable[[PyModule, GuardConfig, SourceBundle], list[Violation]]
CppCheck = Callable[[CppUnit, CppContext], list[Violation]]


def forward_analysis(bundle: SourceBundle, module: PyModule, config: GuardConfig) -> ForwardAnalysis:
    """The (shared, cached) interpretation of ``ModelNew.forward`` in ``module``."""
    return bundle.cached(("forward", module.path, config),
                         lambda: ForwardAnalysis(module, config, custom_op_namespaces(bundle)))


def custom_op_namespaces(bundle: SourceBundle) -> frozenset[str]:
    """Namespaces the solution's C++ defines with ``TORCH_LIBRARY(ns, m)``: ``torch.ops.ns.*`` is the
    extension, not PyTorch."""
    def compute() -> frozenset[str]:
        names = set()
        for unit in bundle.cpp_units:
            for i, tok in enumerate(unit.tokens):
                if tok.text == "TORCH_LIBRARY" and unit.text(i + 1) == "(":
                    names.add(unit.text(i + 2))
        return frozenset(names - cpp_rules.TORCH_NAMESPACES)
    return bundle.cached("custom-ops", compute)


def cpp_context(bundle: SourceBundle, config: GuardConfig) -> CppContext:
    def compute() -> CppContext:
        defined = set()
        for unit in bundle.cpp_units:
            defined |= unit.defined_functions()
        files = {s.path for s in bundle.cpp_sources} | {s.path.rsplit("/", 1)[-1] for s in bundle.cpp_sources}
        return CppContext(config, frozenset(defined), frozenset(files), custom_op_namespaces(bundle))
    return bundle.cached(("cpp-context", config), compute)


class CodeGuard(StaticGuard):
    """A guard for one violation code: a Python check per parsed module and a C++ check per unit."""

    def __init__(self, name: str, python: PythonCheck | None = None, cpp: CppCheck | None = None) -> None:
        self.name = name
        self._python = python
        self._cpp = cpp

    def check(self, bundle: SourceBundle, config: GuardConfig) -> list[Violation]:
        out: list[Violation] = []
        if self._python is not None:
            for module in bundle.parsed_python:
                out.extend(self._python(module, config, bundle))
        if self._cpp is not None:
            context = cpp_context(bundle, config)
            for unit in bundle.cpp_units:
                out.extend(self._cpp(unit, context))
        return out


def _torch_compute(module: PyModule, config: GuardConfig, bundle: SourceBundle) -> list[Violation]:
    analysis = forward_analysis(bundle, module, config)
    return python_rules.check_torch_compilers(module) + list(analysis.violations.values())


def _exception_fallback(module: PyModule, config: GuardConfig, bundle: SourceBundle) -> list[Violation]:
    return python_rules.check_exception_fallback(module, forward_analysis(bundle, module, config))


def _monkeypatch(module: PyModule, config: GuardConfig, bundle: SourceBundle) -> list[Violation]:
    return python_rules.check_monkeypatch(module, forward_analysis(bundle, module, config))


def _unverifiable_source(module: PyModule, config: GuardConfig, bundle: SourceBundle) -> list[Violation]:
    built = any(path.endswith("_binding.cpp") or (path.endswith(COMPILED_SUFFIXES) and includes_launcher_header(text))
                for path, text in bundle.cpp.items())
    return python_rules.check_unverifiable_source(module, extension_built=built)


def _py(check: Callable[[PyModule], list[Violation]]) -> PythonCheck:
    return lambda module, config, bundle: check(module)


def _py_config(check: Callable[[PyModule, GuardConfig], list[Violation]]) -> PythonCheck:
    return lambda module, config, bundle: check(module, config)


def build_static_guards() -> Registry[StaticGuard]:
    """The default guards, registered explicitly, one per violation code."""
    registry: Registry[StaticGuard] = Registry("static guard")
    for guard in (
        CodeGuard("torch-compute-fallback", python=_torch_compute),
        CodeGuard("inherits-reference", python=_py(python_rules.check_inherits_reference)),
        CodeGuard("exception-fallback", python=_exception_fallback),
        CodeGuard("concurrency", python=_py(python_rules.check_concurrency), cpp=cpp_rules.check_concurrency),
        CodeGuard("dynamic-code", python=_py(python_rules.check_dynamic_code), cpp=cpp_rules.check_dynamic),
        CodeGuard("python-from-cpp", cpp=cpp_rules.check_python_calls),
        CodeGuard("monkeypatch", python=_monkeypatch, cpp=cpp_rules.check_operator_overrides),
        CodeGuard("introspection", python=_py(python_rules.check_introspection)),
        CodeGuard("tensor-subclass", python=_py(python_rules.check_tensor_subclass)),
        CodeGuard("file-or-network", python=_py(python_rules.check_file_or_network), cpp=cpp_rules.check_files),
        CodeGuard("stream-creation", python=_py_config(python_rules.check_stream_creation),
                  cpp=cpp_rules.check_streams),
        CodeGuard("aten-compute-fallback", cpp=cpp_rules.check_aten),
        CodeGuard("library-call", python=_py_config(python_rules.library_links), cpp=cpp_rules.check_libraries),
        CodeGuard("token-pasting", cpp=cpp_rules.check_token_pasting),
        CodeGuard("unverifiable-source", python=_unverifiable_source,
                  cpp=cpp_rules.check_includes),
    ):
        registry.register(guard.name, guard)
    return registry


STATIC_GUARDS: Registry[StaticGuard] = build_static_guards()


def run_guards(bundle: SourceBundle, config: GuardConfig, guards: Registry[StaticGuard] | None = None) -> list[Violation]:
    """Every violation in ``bundle``, in a stable order, without duplicates. Never raises: a file that
    does not parse is ``syntax-error``, a guard that cannot analyse the input is ``guard-error``."""
    registry = STATIC_GUARDS if guards is None else guards
    found: list[Violation] = list(bundle.problems)
    for module in bundle.python_modules.values():
        if isinstance(module, str):
            found.append(Violation("syntax-error", module))
    for name in registry:
        try:
            found.extend(registry.get(name).check(bundle, config))
        except Exception as exc:  # noqa: BLE001 - a guard that cannot decide must fail closed
            logger.warning("static guard %s failed", name, exc_info=True)
            found.append(Violation("guard-error", f"static guard {name} could not analyse the solution "
                                                  f"({type(exc).__name__}: {str(exc)[:120]}); simplify the code"))
    unique: dict[tuple[str, str], Violation] = {}
    for violation in found:
        unique.setdefault((violation.code, violation.message), violation)
    return _capped(list(unique.values()))


def _capped(violations: list[Violation]) -> list[Violation]:
    """At most ``MAX_REPORTS_PER_CODE`` violations per code, then one line saying how many more."""
    shown: list[Violation] = []
    hidden: dict[str, int] = {}
    per_code: dict[str, int] = {}
    for violation in violations:
        per_code[violation.code] = per_code.get(violation.code, 0) + 1
        if per_code[violation.code] <= MAX_REPORTS_PER_CODE:
            shown.append(violation)
        else:
            hidden[violation.code] = hidden.get(violation.code, 0) + 1
    for code, count in hidden.items():
        shown.append(Violation(code, f"... and {count} more {code} violations (fix the ones above first)"))
    return shown


def run_static_guards(solution: Solution, config: GuardConfig | None = None,
                      guards: Registry[StaticGuard] | None = None) -> list[Violation]:
    """Static guards over ``solution``'s source text (nothing is built, imported or executed).

    Returns the violations (empty: the solution may be built). Never raises for anything the
    solution contains.
    """
    config = config or GuardConfig()
    if not config.enabled:
        return []
    try:
        bundle = SourceBundle.from_solution(solution)
    except Exception as exc:  # noqa: BLE001 - unreadable input is a verdict, not a crash
        return [Violation("unreadable-source", f"{solution.root}: cannot be read ({type(exc).__name__}: {exc})")]
    return run_guards(bundle, config, guards)

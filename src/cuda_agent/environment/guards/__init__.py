"""Static guards: source-level checks that run in the trusted parent before a candidate is built.

Usage::

    from cuda_agent.environment.guards import GuardConfig, run_static_guards
    violations = run_static_guards(load_solution(path), GuardConfig())

Every violation code is documented in docs/guards.md.
"""

from cuda_agent.environment.guards.base import SourceBundle, StaticGuard
from cuda_agent.environment.guards.catalog import STATIC_GUARDS, run_guards, run_static_guards
from cuda_agent.environment.guards.config import KNOWN_LIBRARIES, GuardConfig, GuardConfigError

__all__ = ["GuardConfig", "GuardConfigError", "KNOWN_LIBRARIES", "STATIC_GUARDS", "SourceBundle", "StaticGuard",
           "run_guards", "run_static_guards"]

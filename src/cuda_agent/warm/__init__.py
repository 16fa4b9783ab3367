"""A local evaluator that keeps warm workers between ``cuda-agent verify --keep-warm`` calls.

Every evaluation needs a fresh candidate worker and a reference worker (interpreters with torch,
CUDA contexts, the sandbox): seconds that a one-shot command pays each time. With ``--keep-warm``
the command hands its evaluation to a background process of the same user that keeps worker slots
started ahead (:class:`~cuda_agent.environment.Prestarter`) for one evaluation configuration. It
is started on first use, serves one evaluation at a time over a Unix socket in the user's cache,
and exits after an idle period. Its verdicts are those of ``environment.evaluate`` under the same
configuration and code: a daemon serves only the configuration, code and device set it was
started for (they are its key; anything else gets a daemon of its own).
"""

from cuda_agent.warm.client import WarmError, evaluate_warm, running_daemons, stop_daemons

__all__ = ["WarmError", "evaluate_warm", "running_daemons", "stop_daemons"]

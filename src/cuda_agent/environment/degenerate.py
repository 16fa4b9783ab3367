"""Degenerate-task detection: tasks whose reference output cannot tell a right kernel from a wrong one.

A task is degenerate when a trivial kernel would pass its correctness check: outputs that are
(near-)constant, so tiny that zeros pass the tolerance, or insensitive to an input or to the input
seed. The data-synthesis filter drops such tasks; the API is exposed here because the check needs
the same trusted reference worker as evaluation. Task code runs only in that worker.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.environment.task import Task
from cuda_agent.environment.worker import RemoteError, WorkerError, WorkerProcess, child_env

DEGENERATE_TIMEOUT_S = 600.0

DEFAULT_ATOL = 1e-2
"""Outputs below this magnitude are tiny (all-zeros would pass a loose tolerance), and outputs
closer than this are equal: the loosest tolerance a precision policy uses (``cuda-agent``)."""


@dataclass(frozen=True)
class DegeneracyReport:
    """``flags`` are stable names; empty means the task can discriminate kernels."""

    task: str
    flags: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    error: str | None = None  # the reference itself failed to run

    @property
    def degenerate(self) -> bool:
        return bool(self.flags) or self.error is not None


def detect_degenerate(task: Task, device: str = "cpu", seeds: int = 3, atol: float = DEFAULT_ATOL,
                      timeout_s: float = DEGENERATE_TIMEOUT_S) -> DegeneracyReport:
    """Run the reference on several seeds and per-input perturbations and flag degeneracies.

    Flags: ``constant-output`` (an output's spread is negligible relative to its magnitude),
    ``tiny-output`` (an output's magnitude is below ``atol``, so all-zeros would pass a loose
    tolerance), ``seed-insensitive`` (different input seeds give the same outputs),
    ``input-ignored`` (re-drawing one input leaves the outputs unchanged), ``non-finite-output``,
    ``nondeterministic`` (same inputs, different outputs), ``input-mutated`` (the forward pass
    writes into an input: a candidate may not, so the reference cannot be judged as its own),
    ``output-aliases-input`` (an output is a view of an input: a candidate's must be fresh tensors).
    """
    scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-degenerate-"))
    worker = WorkerProcess("cuda_agent.environment.reference_worker", env=child_env(), cwd=scratch,
                           log_path=scratch / "degenerate.log")
    try:
        task_file = scratch / "model.py"
        task_file.write_text(task.code)
        worker.request({"op": "load", "task_file": str(task_file), "device": device, "init_seed": 42,
                        "precision": "kernelbench"}, timeout_s)
        reply = worker.request({"op": "degeneracy", "seeds": seeds, "atol": atol}, timeout_s)
        return DegeneracyReport(task.id, list(reply["flags"]), list(reply["details"]))
    except RemoteError as exc:
        return DegeneracyReport(task.id, error=f"reference failed: {exc}")
    except WorkerError as exc:
        return DegeneracyReport(task.id, error=f"reference worker failed: {exc}")
    finally:
        worker.close()
        shutil.rmtree(scratch, ignore_errors=True)

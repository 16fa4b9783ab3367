"""Import-checking task files in a worker process (the parent never imports task code)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from cuda_agent.environment.task import Task
from cuda_agent.environment.worker import RemoteError, WorkerError, WorkerProcess, child_env

PROBE_TIMEOUT_S = 120.0


def probe_tasks(tasks: list[Task], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    """Import each task in a worker; return ``{task.origin: error}`` for those that fail.

    One worker serves all tasks; if a task kills or hangs it, that task is reported and a fresh
    worker continues with the next.
    """
    errors: dict[str, str] = {}
    scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-probe-"))
    worker: WorkerProcess | None = None
    try:
        for index, task in enumerate(tasks):
            if worker is None:
                worker = WorkerProcess("cuda_agent.environment.reference_worker", env=child_env(),
                                       cwd=scratch, log_path=scratch / "probe.log")
            task_file = scratch / f"task_{index}.py"
            task_file.write_text(task.code)
            try:
                worker.request({"op": "probe", "task_file": str(task_file), "index": index}, timeout_s)
            except RemoteError as exc:
                errors[task.origin] = f"import failed: {exc}"
            except WorkerError as exc:
                errors[task.origin] = f"import failed: {exc}"
                worker = None
    finally:
        if worker is not None:
            worker.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return errors

"""Import-checking tasks in a worker process (``cuda-agent tasks list``)."""

from __future__ import annotations

from cuda_agent.environment import Task
from cuda_agent.environment.probe import probe_tasks

from support import SMALL_RELU_TASK


def test_probe_reports_import_failures_and_recovers_from_a_dead_worker() -> None:
    good = SMALL_RELU_TASK.read_text()
    tasks = [
        Task("ok_first", good, "origin/ok_first"),
        Task("bad_import", "import no_such_module_4711\n" + good, "origin/bad_import"),
        Task("kills_worker", "import os\nos._exit(3)\n" + good, "origin/kills_worker"),
        Task("no_model_at_runtime", good + "\ndel Model\n", "origin/no_model_at_runtime"),
        Task("ok_last", good, "origin/ok_last"),
    ]
    errors = probe_tasks(tasks, timeout_s=60)
    assert set(errors) == {"origin/bad_import", "origin/kills_worker", "origin/no_model_at_runtime"}
    assert "import failed: ModuleNotFoundError: No module named 'no_such_module_4711'" in errors["origin/bad_import"]
    assert "exited with status 3" in errors["origin/kills_worker"]
    assert "does not define Model after import" in errors["origin/no_model_at_runtime"]

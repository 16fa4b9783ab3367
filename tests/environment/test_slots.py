"""Worker slots: closing one is safe from several threads at once; on the CPU backend a prestarter
starts the next slot only once the taken one is closed; slots started after a task import the
modules it imported while they wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cuda_agent.environment import evaluate, load_task
from cuda_agent.environment.import_ahead import import_ahead, modules_imported
from cuda_agent.environment.slots import Prestarter, WorkerSlot

from support import EXAMPLES, child_pids, errors_when_run_at_once


def test_a_slot_closed_by_two_threads_at_once_is_closed_once(make_config, scratch_dir: Path) -> None:
    """A prestarter closes a slot mid-warm-up while the warm-up thread, seeing its workers die,
    closes it too: the lease must be released once (twice closed its lock descriptor on a GPU host,
    which could close a descriptor another thread had opened in between)."""
    slot = WorkerSlot(make_config(), warm_device=False)
    lease, releases = slot.lease, []
    release = lease.release

    def counted_release() -> None:
        releases.append(threading.current_thread().name)
        release()

    lease.release = counted_release
    assert errors_when_run_at_once(slot.close, 2) == [] and len(releases) == 1
    assert list(scratch_dir.iterdir()) == []


def test_on_the_cpu_backend_the_next_slot_starts_once_the_taken_one_is_closed(make_config, scratch_dir: Path) -> None:
    """A slot starting (two interpreters importing torch) would take the cores the taken slot's
    evaluation times on: on 2 cores it spread the candidate's timing to 13-32 % relative error."""
    config = make_config()
    with Prestarter(config) as prestarted:
        slot = prestarted.take(config)
        assert slot is not None
        time.sleep(1.0)  # the old prestarter had the next slot's workers running within milliseconds
        assert sorted(child_pids()) == sorted([slot.reference.proc.pid, slot.candidate.proc.pid])
        slot.close()
        assert prestarted.wait_ready(120), "the next slot did not start after the taken one closed"
        assert len(child_pids()) == 2
    assert child_pids() == [] and list(scratch_dir.iterdir()) == []


def test_the_modules_a_task_imports_are_named_as_importable_modules_outside_torch_and_the_stdlib() -> None:
    code = ("import math, os.path\nimport torch\nimport torch.nn as nn\nimport numpy as np\n"
            "from transformers.models.bert.modeling_bert import BertAttention, BertSelfOutput\n"
            "from transformers import BertConfig\nfrom einops import *\nfrom . import local\n")
    assert modules_imported(code) == ("numpy", "transformers.models.bert.modeling_bert", "transformers",
                                      "transformers.BertConfig", "einops")
    assert modules_imported("def broken(:\n") == ()


def test_importing_ahead_skips_what_does_not_import_and_resolves_attributes() -> None:
    assert import_ahead(["json.decoder", "json.decoder.JSONDecoder", "no_such_module_here", "json.NoSuch"]) == [
        "json.decoder", "json.decoder.JSONDecoder"]


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_slots_started_after_a_task_have_its_modules_imported_before_they_are_taken(
        make_config, tmp_path: Path) -> None:
    """A task importing ``pyarrow.parquet`` (a C extension: its library shows in the process's
    memory maps) is judged with a prestarted slot; the slot started after it imports pyarrow while
    it waits, and one started before did not (tasks built from ``transformers`` spent ~4 s
    per worker importing it on a GPU host)."""
    task = tmp_path / "relu_pyarrow.py"
    task.write_text("import pyarrow.parquet\n" + (EXAMPLES / "tasks" / "relu.py").read_text())
    config = make_config()
    with Prestarter(config) as prestarted:
        before = prestarted.take(config)
        assert before is not None
        try:
            assert "pyarrow" not in _maps(before.reference.proc.pid)
        finally:
            before.close()
        verdict = evaluate(load_task(task), EXAMPLES / "solutions" / "cpu" / "relu.py", config, prestarted=prestarted)
        assert verdict.status.value == "correct", verdict.error
        assert prestarted.wait_ready(120), "the next slot did not start"
        slot = prestarted.take(config)
        assert slot is not None
        try:
            for name, worker in (("reference", slot.reference), ("candidate", slot.candidate)):
                assert "pyarrow" in _maps(worker.proc.pid), f"the {name} worker did not import pyarrow ahead"
        finally:
            slot.close()

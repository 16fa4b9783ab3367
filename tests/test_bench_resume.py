"""The pieces that let the long bench runs go on across device calls: the order ``dataset_check.py``
takes unchecked tasks in, and ``synth_multi_gpu.py``'s state archive, packed as a build goes."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from support import REPO_ROOT


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))


def test_dataset_check_reverse_slice_takes_the_same_order_from_its_end(tmp_path: Path, bench: None) -> None:
    """Two runs side by side (one ``--reverse``) judge different tasks until the order runs out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dataset_check

    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(6)], "code": [""] * 6}), data / "tasks.parquet")
    ahead, count = dataset_check.write_slice(data, 3, tmp_path / "ahead")
    behind, _ = dataset_check.write_slice(data, 3, tmp_path / "behind", reverse=True)
    forward = pq.read_table(ahead).column("id").to_pylist()
    assert count == 6 and sorted(forward) == [f"t{i}" for i in range(6)]
    assert pq.read_table(behind).column("id").to_pylist() == forward[::-1]


def test_a_tasks_check_run_keeps_its_stderr_in_the_log_it_is_given(tmp_path: Path, bench: None) -> None:
    """A job tried again after an infrastructure fault leaves no row until it has a verdict: the
    pool's warnings on stderr are then the only account of it, so they are kept."""
    from benchlib import Budget, tasks_check

    log = tmp_path / "tasks_check.log"
    entry = tasks_check(tmp_path / "absent.parquet", [], tmp_path / "run", Budget(60), None, tmp_path / "cache",
                        log=log)
    assert entry["returncode"] == 2 and entry["tasks"] == 0
    assert "absent.parquet" in log.read_text() and log.read_text().strip() in entry["stderr_tail"]


def test_dataset_check_first_tasks_lead_the_slice_and_a_checked_one_is_refused_by_name(
        tmp_path: Path, bench: None) -> None:
    """Tasks forgotten after a fix are judged first, to see it hold; one that has a check already
    (or is not in the set) would be silently skipped, so it is an error naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dataset_check
    from cuda_agent.synth import checks

    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(6)], "code": [""] * 6}), data / "tasks.parquet")
    checks.merge(data / checks.CHECKS, [{"task": "t0", "status": "correct", "checked_at": 1.0}])
    path, count = dataset_check.write_slice(data, 3, tmp_path / "slice", reverse=True, first=["t5", "t2", "t5"])
    order = pq.read_table(path).column("id").to_pylist()
    assert count == 5 and order[:2] == ["t5", "t2"] and sorted(order) == ["t1", "t2", "t3", "t4", "t5"]
    with pytest.raises(SystemExit, match="t0, t9 not among the 5 tasks"):
        dataset_check.write_slice(data, 3, tmp_path / "again", first=["t9", "t0"])


def _state(work: Path, journal: str) -> None:
    import synth_multi_gpu

    work.mkdir(exist_ok=True)
    (work / synth_multi_gpu.JOURNAL).write_text(journal)
    (work / synth_multi_gpu.META).write_text("{}")


def test_pack_replaces_the_archive_whole_and_leaves_no_partial_file(tmp_path: Path, bench: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import synth_multi_gpu

    work, out = tmp_path / "work", tmp_path / "out"
    _state(work, "first")
    monkeypatch.setattr(synth_multi_gpu, "PART_BYTES", 64)  # the tar headers alone make several parts
    parts = synth_multi_gpu.pack(work, out)
    assert len(parts) > 1 and all(path.name.startswith("ops-state.tar.gz.part") for path in parts)
    monkeypatch.setattr(synth_multi_gpu, "PART_BYTES", 15 << 20)
    _state(work, "second")
    assert synth_multi_gpu.pack(work, out) == [out / "ops-state.tar.gz"]
    assert sorted(path.name for path in out.iterdir()) == ["ops-state.tar.gz"]  # the parts went, no .writing left
    synth_multi_gpu.unpack(out / "ops-state.tar.gz", tmp_path / "back")
    assert (tmp_path / "back" / synth_multi_gpu.JOURNAL).read_text() == "second"


def test_snapshots_pack_at_the_first_batch_then_once_each_period(tmp_path: Path, bench: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import synth_multi_gpu

    work, out = tmp_path / "work", tmp_path / "out"
    _state(work, "one")
    clock = [100.0]
    monkeypatch.setattr(synth_multi_gpu.time, "monotonic", lambda: clock[0])
    with synth_multi_gpu.Snapshots(work, out, every_s=60.0, stall_s=3600.0) as snapshots:
        snapshots.batch()
        _state(work, "two")
        clock[0] += 30
        snapshots.batch()  # within the period: the archive still holds the first batch's state
        with tarfile.open(out / "ops-state.tar.gz") as archive:
            assert archive.extractfile(synth_multi_gpu.JOURNAL).read() == b"one"
        clock[0] += 30
        snapshots.batch()
    with tarfile.open(out / "ops-state.tar.gz") as archive:
        assert archive.extractfile(synth_multi_gpu.JOURNAL).read() == b"two"


def test_snapshots_dump_every_threads_stack_when_no_batch_comes(tmp_path: Path) -> None:
    """A build whose batches stop says where it waits: the stall dump reaches stderr, and a batch
    within the period keeps it quiet."""
    script = (
        "import sys, time; from pathlib import Path\n"
        f"sys.path[:0] = [{str(REPO_ROOT / 'bench')!r}, {str(REPO_ROOT / 'src')!r}]\n"
        "import synth_multi_gpu\n"
        f"work = Path({str(tmp_path / 'work')!r}); work.mkdir()\n"
        f"with synth_multi_gpu.Snapshots(work, Path({str(tmp_path / 'out')!r}), stall_s=1.0) as s:\n"
        "    for _ in range(4):\n"
        "        time.sleep(0.4); s.batch()\n"
        "    print('batches done', file=sys.stderr, flush=True)\n"
        "    time.sleep(1.6)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    quiet, stalled = result.stderr.split("batches done", 1)
    assert "Timeout (0:00:01)!" not in quiet
    assert "Timeout (0:00:01)!" in stalled and 'File "<string>", line 9' in stalled  # the stalled line

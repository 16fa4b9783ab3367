"""The pipeline end to end on CPU, with two device lane groups (what one group per GPU is on a GPU
host): every stage's decision is journaled with the lane that made it, a task over the size bound
is scaled down, and a run interrupted in any stage and resumed gives the same dataset as one that
ran through."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cuda_agent.synth import pipeline
from cuda_agent.synth.dataset import DatasetWriter, read_dataset, stats
from cuda_agent.synth.filter import FilterConfig
from cuda_agent.synth.records import TaskRecord

OPS = ["tanh", "sigmoid", "relu", "COMPOSER-FAILS", "exp", "EAGER-FAILS", "tanh", "cos"]
BIG_BATCH, BOUND_MB = 1 << 16, 8.0
"""The cos task has 32 MiB of inputs: over the run's 8 MiB bound, it is scaled to a batch of 16384."""


def _composer(seed: int) -> TaskRecord:
    op = OPS[seed]
    if op == "COMPOSER-FAILS":
        raise ValueError("no compatible operators for this seed")
    body = "return x @ x" if op == "EAGER-FAILS" else f"return torch.{op}(x) * self.scale"
    batch = "batch_size" if op == "cos" else "32"
    code = (
        "import torch\nimport torch.nn as nn\n\n" + (f"batch_size = {BIG_BATCH}\n" if op == "cos" else "") + "\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.scale = nn.Parameter(torch.randn(128))\n\n"
        f"    def forward(self, x):\n        {body}\n\n\n"
        f"def get_inputs():\n    return [torch.randn({batch}, 128)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    return TaskRecord(code, [f"torch.{op}"], "deterministic", seed)


def _same_tasks(a: Path, b: Path) -> bool:
    """The same rows in the same order; the measured times naturally differ between runs."""
    def rows(path: Path) -> list[dict]:
        return [{k: v for k, v in r.to_row().items() if k not in ("eager_ms", "compile_ms")} for r in read_dataset(path)]
    return rows(a) == rows(b) and stats(a)["rejected"] == stats(b)["rejected"]


def _config() -> pipeline.RunConfig:
    checks = FilterConfig(device="cpu", window_ms=(0.0, 10_000.0), compile=False, restart_every=8)
    return pipeline.RunConfig(n=len(OPS), filter=checks, workers=2, devices=("cpu:0", "cpu:1"), max_input_mb=BOUND_MB,
                              batch_size=2)


class Interrupt(KeyboardInterrupt):
    pass


def _interrupt_at(stage: str, after: int):
    def progress(name: str, done: int, total: int) -> None:
        if name == stage and done == after:
            raise Interrupt
    return progress


STATUSES: list[pipeline.RunStatus] = []


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight")
    pipeline.run(_config(), out, _composer, on_batch=STATUSES.append, command="cuda-agent synth run --n 8")
    return out


def test_the_funnel_counts_every_stage(uninterrupted: Path) -> None:
    records = read_dataset(uninterrupted)
    assert sorted(r.ops[0] for r in records) == ["torch.cos", "torch.exp", "torch.relu", "torch.sigmoid", "torch.tanh"]
    assert all(r.eager_ms and r.device == "cpu" for r in records)
    numbers = stats(uninterrupted)
    text = str(numbers)
    assert "composer-failed" in text and "eager-error" in text
    assert (uninterrupted / "README.md").exists() and (uninterrupted / "tasks.parquet").exists()


def test_both_device_groups_filter_and_each_decision_names_its_lane(uninterrupted: Path) -> None:
    lanes = [json.loads(line).get("lane") for line in (uninterrupted / "journal.jsonl").read_text().splitlines()]
    filtered = [lane for lane in lanes if lane is not None]
    assert len(filtered) == 6 and set(filtered) == {"cpu:0/0", "cpu:1/1"}  # lane i on device i % 2
    record, = [json.loads(line) for line in (uninterrupted / pipeline.RUNS).read_text().splitlines()]
    assert record["command"] == "cuda-agent synth run --n 8" and record["config"]["devices"] == ["cpu:0", "cpu:1"]
    this_run = record["this_run"]
    assert this_run["decided"] == 6 and this_run["accepted"] == 5 and this_run["composed"] == len(OPS)
    assert {name: counts["decided"] for name, counts in this_run["per_device"].items()} == {
        "cpu:0": filtered.count("cpu:0/0"), "cpu:1": filtered.count("cpu:1/1")}
    assert [status.decided for status in STATUSES] == [2, 4, 6, 6]  # a line per batch of 2, and the last


def test_a_task_over_the_size_bound_is_scaled_down_not_dropped(uninterrupted: Path) -> None:
    cos, = [r for r in read_dataset(uninterrupted) if r.ops == ["torch.cos"]]
    assert f"batch_size = {BIG_BATCH // 4}\n" in cos.code and cos.eager_ms  # 32 MiB -> 8 MiB, then filtered
    entries = [json.loads(line) for line in (uninterrupted / pipeline.COMPOSED).read_text().splitlines()]
    resized, = [entry for entry in entries if "resized_from_bytes" in entry]
    assert resized["resized_from_bytes"] == 4 * 128 * BIG_BATCH and resized["input_bytes"] == BOUND_MB * 2**20
    assert all(entry["input_bytes"] == 4 * 32 * 128 for entry in entries if "record" in entry and entry is not resized)


@pytest.mark.parametrize("stage, after", [("compose", 3), ("filter", 2)])
def test_an_interrupted_run_resumes_to_the_same_dataset(tmp_path: Path, uninterrupted: Path, stage: str,
                                                        after: int) -> None:
    with pytest.raises(Interrupt):
        pipeline.run(_config(), tmp_path, _composer, progress=_interrupt_at(stage, after))
    assert not (tmp_path / "tasks.parquet").exists()
    composed_before = len((tmp_path / pipeline.COMPOSED).read_text().splitlines())
    assert composed_before >= (after if stage == "compose" else 1)
    calls = []

    def counting_composer(seed: int) -> TaskRecord:
        calls.append(seed)
        return _composer(seed)

    pipeline.run(_config(), tmp_path, counting_composer)
    assert _same_tasks(tmp_path, uninterrupted)
    assert len(calls) == len(OPS) - composed_before  # composed seeds are not redone


def test_a_torn_composed_journal_line_is_dropped_and_redone(tmp_path: Path, uninterrupted: Path) -> None:
    with pytest.raises(Interrupt):
        pipeline.run(_config(), tmp_path, _composer, progress=_interrupt_at("compose", 2))
    with open(tmp_path / pipeline.COMPOSED, "ab") as f:
        f.write(b'{"seed": 2, "rec')  # a crash in the middle of a write
    pipeline.run(_config(), tmp_path, _composer)
    assert _same_tasks(tmp_path, uninterrupted)


def test_bad_run_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="workers"):
        pipeline.RunConfig(n=3, workers=0)
    with pytest.raises(ValueError, match="time_limit_s"):
        pipeline.RunConfig(n=3, time_limit_s=0)
    with pytest.raises(ValueError, match="benchmark"):
        pipeline.RunConfig(n=3, benchmark=Path("/nonexistent/kernelbench"))
    with pytest.raises(ValueError, match="max_input_mb must be > 0"):
        pipeline.RunConfig(n=3, max_input_mb=0)
    with pytest.raises(ValueError, match="max_op_sequence_share must be in"):
        pipeline.RunConfig(n=3, max_op_sequence_share=1.5)


@pytest.mark.parametrize("stage", ["compose", "filter"])
def test_a_run_stopped_by_its_time_limit_writes_a_card_and_resumes_to_the_same_dataset(
        tmp_path: Path, uninterrupted: Path, stage: str) -> None:
    config = _config()
    if stage == "filter":  # every seed composed, then the filter stopped before deciding
        with pytest.raises(Interrupt):
            pipeline.run(config, tmp_path, _composer, progress=_interrupt_at("compose", len(OPS)))
    config.time_limit_s = 1e-6
    numbers = pipeline.run(config, tmp_path, _composer)
    assert numbers["tasks"] == 0 and numbers["pending"] > 0 and numbers["this_run"]["accepted"] == 0
    if stage == "filter":
        assert numbers["pending"] == 6  # 8 seeds: one composer failure, one repeat of tanh
    assert (tmp_path / "README.md").exists() and (tmp_path / "tasks.parquet").exists()
    config.time_limit_s = None
    numbers = pipeline.run(config, tmp_path, _composer)
    assert numbers["pending"] == 0 and numbers["this_run"]["accepted"] == numbers["tasks"] == 5
    assert _same_tasks(tmp_path, uninterrupted)


def _benchmark_with_a_sigmoid_copy(tmp_path: Path) -> Path:
    benchmark = tmp_path / "benchmark"
    benchmark.mkdir()
    (benchmark / "1_Sigmoid.py").write_text(_composer(1).code.replace("32, 128", "64, 256"))  # a resized copy
    return benchmark


def test_a_benchmark_given_on_resume_withdraws_accepted_copies(tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    pipeline.run(_config(), out, _composer)
    benchmark = _benchmark_with_a_sigmoid_copy(tmp_path)
    config = _config()
    config.benchmark = benchmark
    for _ in range(2):  # the second resume finds nothing new to withdraw
        numbers = pipeline.run(config, out, _composer)
        assert sorted(r.ops[0] for r in read_dataset(out)) == ["torch.cos", "torch.exp", "torch.relu", "torch.tanh"]
        assert numbers["tasks"] == 4 and numbers["rejected"]["decontaminate"]["benchmark_match"] == 1


def test_a_finished_dataset_is_decontaminated_on_its_own_settings(tmp_path: Path, uninterrupted: Path) -> None:
    out = tmp_path / "dataset"
    shutil.copytree(uninterrupted, out)
    numbers = pipeline.decontaminate_dataset(out, _benchmark_with_a_sigmoid_copy(tmp_path))
    assert numbers["withdrawn"] == 1 and numbers["tasks"] == 4
    assert "torch.sigmoid" not in {r.ops[0] for r in read_dataset(out / "tasks.parquet")}
    assert pipeline.decontaminate_dataset(out, tmp_path / "benchmark")["withdrawn"] == 0


def _checks_store(folder: Path, statuses: dict[str, str]) -> Path:
    """A ``tasks check`` results folder as the evaluation runner writes it (``results.sqlite``)."""
    from cuda_agent.evaluate.store import STORE_FILE, ResultRecord, ResultsStore

    folder.mkdir()
    store = ResultsStore(folder / STORE_FILE)
    store.start_run("check", {}, {})
    for task, status in statuses.items():
        store.record("check", ResultRecord(task, None, "dataset", None, None, status, status == "correct", None, None,
                                           "cpu:0", 1, 1.0, 0.0))
    store.close()
    return folder


def test_the_full_card_reports_every_section_from_the_run_records(uninterrupted: Path, tmp_path: Path) -> None:
    from cuda_agent.synth.full_card import make_card
    from cuda_agent.synth.mining import SeedCatalogue, save_catalogue
    from cuda_agent.synth.records import SeedOp

    out = tmp_path / "dataset"
    shutil.copytree(uninterrupted, out)
    ops = [SeedOp(f"torch.{name}", "function", "torch", family, 1, (2,), ("float32",), "same")
           for name, family in [("tanh", "activation"), ("sigmoid", "activation"), ("relu", "activation"),
                                ("gelu", "activation"), ("exp", "elementwise"), ("cos", "elementwise")]]
    save_catalogue(SeedCatalogue(ops), out / "seed_ops.json")
    benchmark = tmp_path / "kb"
    (benchmark / "level1").mkdir(parents=True)
    (benchmark / "level1" / "1_Exp.py").write_text(_composer(4).code.replace("32, 128", "16, 64"))
    ids = [record.id for record in read_dataset(out)]
    checks = _checks_store(tmp_path / "checks", {ids[0]: "correct", ids[1]: "correct", ids[2]: "task_error"})
    numbers = make_card(out, benchmark=benchmark, checks=checks)
    card = (out / "README.md").read_text()
    assert numbers["tasks"] == 5 and (out / "ops_per_task.png").stat().st_size > 0 and (out / "eager_ms.png").exists()
    assert "| `cuda-agent synth run --n 8` | CPU," in card  # how it was made: the recorded command and machine
    assert numbers["runs"][0]["this_run"]["accepted"] == 5
    sizes = numbers["input_sizes"]
    assert sizes["resized"] == 1 and sizes["over_bound"] == 0 and sizes["max_mb"] == BOUND_MB
    assert "1 composed tasks were resized to fit the bound" in card
    assert {row["family"]: (row["seed_ops"], row["ops_used"]) for row in numbers["coverage"]} == {
        "activation": (4, 3), "elementwise": (2, 2)}
    assert numbers["diversity"]["op_sequences"] == 5 and numbers["diversity"]["clusters"] == 0
    assert numbers["checks"] == {"path": str(checks), "checked": 3, "correct": 2,
                                 "statuses": {"correct": 2, "task_error": 1}, "not_checked": 2, "timed_by_check": 0,
                                 "failed": [{"task": ids[2], "status": "task_error", "error": None}], "withdrawn": [],
                                 "outside_window": []}
    assert numbers["decontamination"]["levels"] == {"level1": {"files": 1, "withdrawn": 0, "matches_now": 1,
                                                               "close": 0}}  # the exp task copies 1_Exp.py
    assert "| filter: eager-error | 1 |" in card and "| compose: composer-failed | 1 |" in card
    for heading in ("How it was made", "Fused operators per task", "Input sizes", "Operator families and coverage",
                    "Diversity", "Filter funnel", "Judged-ready", "Decontamination", "differences from CUDA-Agent"):
        assert heading in card


def test_a_sets_self_check_withdraws_the_tasks_it_fails_and_gives_the_rest_its_times(uninterrupted: Path,
                                                                                     tmp_path: Path) -> None:
    from cuda_agent.synth import checks
    from cuda_agent.synth.full_card import make_card

    out = tmp_path / "dataset"
    shutil.copytree(uninterrupted, out)
    ids = sorted(record.id for record in read_dataset(out))
    row = {"error": None, "eager_tf32_on_ms": 1.0, "compile_tf32_on_ms": 1.0, "input_gb": 0.1, "output_gb": 0.1,
           "verdict_s": 5.0, "device": "NVIDIA H200", "checked_at": 1.0}
    checks.merge(out / checks.CHECKS, [
        {**row, "task": ids[0], "status": "correct", "eager_ms": 12.5, "compile_ms": 3.25},
        {**row, "task": ids[1], "status": "task_error", "error": "its output's shape depends on rounding\nmore",
         "eager_ms": None, "compile_ms": None},
        {**row, "task": ids[2], "status": "infra_error", "error": "the worker died", "eager_ms": None, "compile_ms": None},
        {**row, "task": "not-in-the-set", "status": "correct", "eager_ms": 1.0, "compile_ms": 1.0}])
    numbers = pipeline.apply_checks(out, out / checks.CHECKS)
    assert (numbers["withdrawn"], numbers["retimed"], numbers["tasks"]) == (1, 1, 4)
    assert numbers["rejected"]["self_check"] == {"task_error": 1}
    by_id = {record.id: record for record in read_dataset(out)}
    assert ids[1] not in by_id and ids[2] in by_id  # a worker's failure is not held against its task
    assert (by_id[ids[0]].eager_ms, by_id[ids[0]].compile_ms, by_id[ids[0]].device) == (12.5, 3.25, "NVIDIA H200")
    again = pipeline.apply_checks(out, out / checks.CHECKS)  # nothing new: nothing journaled
    assert (again["withdrawn"], again["retimed"], again["tasks"]) == (0, 0, 4)
    with DatasetWriter.reopen(out) as writer:  # a later call's finalize replays the journal: the times stay
        writer.finalize(writer.families())
    kept = {record.id: record for record in read_dataset(out)}
    assert kept[ids[0]].eager_ms == 12.5 and ids[1] not in kept
    card = make_card(out, checks=out / checks.CHECKS, plots=False)["checks"]
    assert card["timed_by_check"] == 1 and card["failed"] == [{"task": ids[2], "status": "infra_error",
                                                               "error": "the worker died"}]
    assert card["withdrawn"] == [{"task": ids[1], "status": "task_error",
                                  "error": "its output's shape depends on rounding\nmore"}]
    assert "Withdrawn by their check" in (out / "README.md").read_text()
    assert "| times measured on (tasks) | NVIDIA H200: 1; cpu (the synthesis filter): 3 |" in (out / "README.md").read_text()

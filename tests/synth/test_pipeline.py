"""The pipeline end to end on CPU: every stage's decision is journaled, and a run interrupted in
any stage and resumed gives the same dataset as one that ran through."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cuda_agent.synth import pipeline
from cuda_agent.synth.dataset import read_dataset, stats
from cuda_agent.synth.filter import FilterConfig
from cuda_agent.synth.records import TaskRecord

OPS = ["tanh", "sigmoid", "relu", "COMPOSER-FAILS", "exp", "EAGER-FAILS", "tanh"]


def _composer(seed: int) -> TaskRecord:
    op = OPS[seed]
    if op == "COMPOSER-FAILS":
        raise ValueError("no compatible operators for this seed")
    body = "return x @ x" if op == "EAGER-FAILS" else f"return torch.{op}(x) * self.scale"
    code = (
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.scale = nn.Parameter(torch.randn(128))\n\n"
        f"    def forward(self, x):\n        {body}\n\n\n"
        "def get_inputs():\n    return [torch.randn(32, 128)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    return TaskRecord(code, [f"torch.{op}"], "deterministic", seed)


def _same_tasks(a: Path, b: Path) -> bool:
    """The same rows in the same order; the measured times naturally differ between runs."""
    def rows(path: Path) -> list[dict]:
        return [{k: v for k, v in r.to_row().items() if k not in ("eager_ms", "compile_ms")} for r in read_dataset(path)]
    return rows(a) == rows(b) and stats(a)["rejected"] == stats(b)["rejected"]


def _config() -> pipeline.RunConfig:
    return pipeline.RunConfig(n=len(OPS), filter=FilterConfig(device="cpu", window_ms=(0.0, 10_000.0), compile=False),
                              workers=2)


class Interrupt(KeyboardInterrupt):
    pass


def _interrupt_at(stage: str, after: int):
    def progress(name: str, done: int, total: int) -> None:
        if name == stage and done == after:
            raise Interrupt
    return progress


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight")
    pipeline.run(_config(), out, _composer)
    return out


def test_the_funnel_counts_every_stage(uninterrupted: Path) -> None:
    records = read_dataset(uninterrupted)
    assert sorted(r.ops[0] for r in records) == ["torch.exp", "torch.relu", "torch.sigmoid", "torch.tanh"]
    assert all(r.eager_ms and r.device == "cpu" for r in records)
    numbers = stats(uninterrupted)
    text = str(numbers)
    assert "composer-failed" in text and "eager-error" in text
    assert (uninterrupted / "README.md").exists() and (uninterrupted / "tasks.parquet").exists()


@pytest.mark.parametrize("stage, after", [("compose", 3), ("filter", 2)])
def test_an_interrupted_run_resumes_to_the_same_dataset(tmp_path: Path, uninterrupted: Path, stage: str,
                                                        after: int) -> None:
    with pytest.raises(Interrupt):
        pipeline.run(_config(), tmp_path, _composer, progress=_interrupt_at(stage, after))
    assert not (tmp_path / "tasks.parquet").exists()
    calls = []

    def counting_composer(seed: int) -> TaskRecord:
        calls.append(seed)
        return _composer(seed)

    pipeline.run(_config(), tmp_path, counting_composer)
    assert _same_tasks(tmp_path, uninterrupted)
    assert len(calls) == (len(OPS) - after if stage == "compose" else 0)  # composed seeds are not redone


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


@pytest.mark.parametrize("stage", ["compose", "filter"])
def test_a_run_stopped_by_its_time_limit_writes_a_card_and_resumes_to_the_same_dataset(
        tmp_path: Path, uninterrupted: Path, stage: str) -> None:
    config = _config()
    if stage == "filter":
        pipeline.compose_all(config, tmp_path / pipeline.COMPOSED, _composer)
    config.time_limit_s = 1e-6
    numbers = pipeline.run(config, tmp_path, _composer)
    assert numbers["tasks"] == 0 and numbers["pending"] > 0 and numbers["this_run"]["accepted"] == 0
    if stage == "filter":
        assert numbers["pending"] == 5  # 7 seeds: one composer failure, one repeat of tanh
    assert (tmp_path / "README.md").exists() and (tmp_path / "tasks.parquet").exists()
    config.time_limit_s = None
    numbers = pipeline.run(config, tmp_path, _composer)
    assert numbers["pending"] == 0 and numbers["this_run"]["accepted"] == numbers["tasks"] == 4
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
        assert sorted(r.ops[0] for r in read_dataset(out)) == ["torch.exp", "torch.relu", "torch.tanh"]
        assert numbers["tasks"] == 3 and numbers["rejected"]["decontaminate"]["benchmark_match"] == 1


def test_a_finished_dataset_is_decontaminated_on_its_own_settings(tmp_path: Path, uninterrupted: Path) -> None:
    out = tmp_path / "dataset"
    shutil.copytree(uninterrupted, out)
    numbers = pipeline.decontaminate_dataset(out, _benchmark_with_a_sigmoid_copy(tmp_path))
    assert numbers["withdrawn"] == 1 and numbers["tasks"] == 3
    assert "torch.sigmoid" not in {r.ops[0] for r in read_dataset(out / "tasks.parquet")}
    assert pipeline.decontaminate_dataset(out, tmp_path / "benchmark")["withdrawn"] == 0

"""``cuda-agent synth``: each command end to end on CPU, and bad input named in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cuda_agent.synth.dataset import read_dataset
from cuda_agent.synth.mining import mine_seed_ops, save_catalogue

from support import EXAMPLES


def _synth(cli: list[str], env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([*cli, "synth", *map(str, args)], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's mined catalogue (test_composer.py and test_mining.py share the file)."""
    path = tmp_path_factory.getbasetemp() / "seed-catalogue.json"
    if not path.exists():
        save_catalogue(mine_seed_ops(), path)
    return path


FAST_FILTER = ("--device", "cpu", "--window", "0", "10000", "--no-compile", "--workers", "2")


def test_compose_then_filter_then_stats(cli, cli_env, catalogue: Path, tmp_path: Path) -> None:
    composed = tmp_path / "composed.jsonl"
    made = _synth(cli, cli_env, "compose", "--n", 4, "--catalogue", catalogue, "--out", composed,
                  "--device", "cpu", "--window", "0.01", "1000", "--workers", 2)
    assert made.returncode == 0, made.stderr
    assert len(composed.read_text().splitlines()) == 4 and "4 tasks appended" in made.stdout
    filtered = _synth(cli, cli_env, "filter", composed, "--out", tmp_path / "data", *FAST_FILTER)
    assert filtered.returncode == 0, filtered.stderr
    assert "accepted/min" in filtered.stdout and (tmp_path / "data" / "README.md").exists()
    shown = _synth(cli, cli_env, "stats", tmp_path / "data", "--json")
    numbers = json.loads(shown.stdout)
    assert numbers["tasks"] == len(read_dataset(tmp_path / "data")) and numbers["decided"] == 4


def test_run_with_a_time_limit_saves_what_it_decided_and_resumes(cli, cli_env, catalogue: Path,
                                                                 tmp_path: Path) -> None:
    args = ("run", "--n", 3, "--catalogue", catalogue, "--out", tmp_path, *FAST_FILTER)
    stopped = _synth(cli, cli_env, *args, "--time-limit", "0.00001")
    assert stopped.returncode == 0, stopped.stderr
    assert "run the same command to resume" in " ".join(stopped.stdout.split())
    resumed = _synth(cli, cli_env, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "time limit" not in resumed.stdout and json.loads(
        _synth(cli, cli_env, "stats", tmp_path, "--json").stdout)["decided"] >= 1


def test_card_of_the_bundled_sample_says_what_it_cannot_know(cli, cli_env, tmp_path: Path) -> None:
    made = _synth(cli, cli_env, "card", EXAMPLES / "data" / "synth-h100-sample", "--out", tmp_path / "README.md")
    assert made.returncode == 0, made.stderr
    card = (tmp_path / "README.md").read_text()
    assert "200 tasks" in card and (tmp_path / "eager_ms.png").exists()
    assert "no journal" in card and "no run records" in card and "Not run on this set" in card


@pytest.mark.parametrize("args, message", [
    (("stats", "/nonexistent/data"), "/nonexistent/data"),
    (("run", "--n", "2", "--out", "{tmp}", "--workers", "0", "--device", "cpu"), "workers must be >= 1"),
    (("run", "--n", "2", "--out", "{tmp}", "--device", "tpu"), "filter.device must be one of"),
    (("filter", "{tmp}/missing.jsonl", "--out", "{tmp}/data", "--device", "cpu"), "missing.jsonl"),
    (("compose", "--n", "2", "--catalogue", "{tmp}/none.json", "--device", "cpu"), "no such seed catalogue"),
    (("decontaminate", "{tmp}", "--benchmark", "{tmp}"), "not a dataset directory"),
    (("decontaminate", "{examples}/data/synth-h100-sample", "--benchmark", "{tmp}", "--similarity", "2"),
     "--similarity must be in (0, 1]"),
    (("sample", "{examples}/data/synth-h100-sample", "--n", "201", "--out", "{tmp}/s"), "between 1 and the 200 tasks"),
    (("apply-checks", "{examples}/data/synth-h100-sample", "--checks", "{tmp}/checks.parquet"),
     "checks.parquet: no such file"),
    (("card", "{tmp}/missing"), "not a dataset directory"),
    (("card", "{examples}/data/synth-h100-sample", "--out", "{tmp}/c.md", "--checks", "{tmp}"), "no results store"),
    (("run", "--n", "2", "--out", "{tmp}", "--device", "cpu", "--devices", "gpu0"), "lane groups named cpu or cpu:<k>"),
    (("run", "--n", "2", "--out", "{tmp}", "--device", "cuda", "--devices", "0"), "CUDA_VISIBLE_DEVICES"),
])
def test_bad_input_is_named_with_exit_status_2(cli, cli_env, tmp_path: Path, args, message: str) -> None:
    result = _synth(cli, cli_env, *(arg.format(tmp=tmp_path, examples=EXAMPLES) for arg in args))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in " ".join((result.stdout + result.stderr).split())
    assert "Traceback" not in result.stderr

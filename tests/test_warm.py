"""``cuda-agent verify --keep-warm`` and ``cuda-agent warm``: one background evaluator per
configuration, reused by later calls, giving the verdicts the command gives by itself, and gone
after ``warm stop`` or its idle time.

The commands run as subprocesses (like tests/test_cli.py) on the session's build cache, with a
private keep-warm folder per test.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support import SMALL_RELU_TASK, is_live, wait_until


@pytest.fixture()
def warm_env(cli_env, tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    return {**cli_env, "CUDA_AGENT_WARM_DIR": str(folder)}


@pytest.fixture()
def warm_cli(cli, warm_env):
    """``warm_cli(*args)``: the CLI with the test's keep-warm folder; every daemon is stopped after."""

    def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *map(str, args)], env=env or warm_env, capture_output=True, text=True, timeout=600)

    yield run
    run("warm", "stop")


def _status(warm_cli) -> list[dict]:
    result = warm_cli("warm", "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _verify(warm_cli, fast_config_file: Path, solution: Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    result = warm_cli("verify", SMALL_RELU_TASK, solution, "--device", "cpu", "--json", "--no-compile-baseline",
                      "--config", fast_config_file, *extra, env=env)
    assert result.returncode == 0, result.stderr
    assert "evaluating in this process" not in result.stderr, result.stderr  # no fallback: the daemon answered
    return json.loads(result.stdout)


@pytest.mark.slow
def test_keep_warm_calls_share_one_evaluator_per_configuration_and_stop_ends_them(
        warm_cli, fast_config_file: Path, fault_solution) -> None:
    honest = fault_solution("relu_ok")
    first = _verify(warm_cli, fast_config_file, honest, "--keep-warm")
    second = _verify(warm_cli, fast_config_file, honest, "--keep-warm")
    for verdict in (first, second):
        assert verdict["correct"] is True and verdict["reward"] >= 1
        assert verdict["environment"]["prestarted"] is True
    [daemon] = _status(warm_cli)
    assert daemon["evaluations"] == 2 and daemon["device"] == "cpu"

    other = _verify(warm_cli, fast_config_file, honest, "--keep-warm", "--trials", "6")  # another config: its own
    assert other["correct"] is True and len([t for t in other["trials"] if t["kind"] == "standard"]) == 6
    daemons = _status(warm_cli)
    assert sorted(d["evaluations"] for d in daemons) == [1, 2]

    assert "stopped 2 keep-warm evaluators" in warm_cli("warm", "stop").stdout
    assert wait_until(lambda: not any(is_live(d["pid"]) for d in daemons), timeout_s=30)
    assert _status(warm_cli) == []


@pytest.mark.slow
def test_keep_warm_verdict_matches_the_one_shot_verdict_and_the_daemon_exits_when_idle(
        warm_cli, warm_env, fast_config_file: Path, fault_solution) -> None:
    wrong = fault_solution("relu_slightly_wrong")
    one_shot = _verify(warm_cli, fast_config_file, wrong)
    warm = _verify(warm_cli, fast_config_file, wrong, "--keep-warm", env={**warm_env, "CUDA_AGENT_KEEP_WARM_IDLE_S": "2"})
    for key in ("compiled", "correct", "reward", "status", "violations", "preset", "precision_policy"):
        assert warm[key] == one_shot[key], key
    assert not warm["correct"]
    assert wait_until(lambda: _status(warm_cli) == [], timeout_s=30)  # idle for 2 s: it exits by itself


def test_a_keep_warm_folder_others_can_enter_is_refused(warm_cli, warm_env, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    result = warm_cli("warm", "status", env={**warm_env, "CUDA_AGENT_WARM_DIR": str(shared)})
    assert result.returncode == 2
    assert "must be a directory of this user with mode 0700" in " ".join(result.stderr.split())

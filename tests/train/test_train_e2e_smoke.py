"""``bench/train_e2e.py --smoke`` on the CPU backend (and, marked ``gpu``, on CUDA): the bootstrap
path end to end (replayed solutions scored by the real evaluator, warm-up, RFT, value
pre-training, PPO, held-out episodes) in resumable invocations, and the results JSON with every
stage's keys."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from support import REPO_ROOT

KEYS = ("mean_reward_first", "mean_reward_last", "pass_rate", "clip_fraction", "kl", "gen_tokens_per_s",
        "update_tokens_per_s", "peak_gpu_gb")


def _bench():
    spec = importlib.util.spec_from_file_location("train_e2e", REPO_ROOT / "bench" / "train_e2e.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_smoke_run_resumes_step_by_step_and_reports_every_stage(device, tmp_path, session_cache_dir, capsys):
    bench = _bench()
    args = ["--out", str(tmp_path / "run"), "--smoke", "--device", device, "--cache-dir", str(session_cache_dir)]
    assert bench.main([*args, "--budget-s", "0"]) == 0  # a spent budget: nothing runs, the JSON says so
    assert json.loads((tmp_path / "run" / "train_e2e.json").read_text())["steps_done"] == []
    bench.main([*args, "--budget-s", "1"])  # stops during or right after the recording
    assert "(run again)" in capsys.readouterr().out and (tmp_path / "run" / "prepare.json").is_file()
    bench.main([*args, "--budget-s", "3000", "--stop-after", "rft"])
    assert "next: value (run again)" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "train_e2e.json").read_text())["steps_done"] == ["prepare", "warmup", "rft"]
    (tmp_path / "run" / "train.yaml").unlink()  # every invocation writes the config from the plan again
    for _ in range(len(bench.STEPS)):
        bench.main([*args, "--budget-s", "3000"])
        if "all steps done" in capsys.readouterr().out:
            break
    result = json.loads((tmp_path / "run" / "train_e2e.json").read_text())
    assert result["steps_done"] == list(bench.STEPS)
    assert result["recorded"]["successful"] == result["recorded"]["episodes"] >= 1  # the bundled solutions pass
    recorded = [json.loads(line)["episode_id"] for line in (tmp_path / "run" / "replays.jsonl").open()]
    assert len(recorded) == len(set(recorded)) == result["recorded"]["episodes"]  # resumed, nothing run twice
    for name in bench.STAGES:
        assert set(KEYS) <= set(result["stages"][name]), name
        peak = result["stages"][name]["peak_gpu_gb"]
        assert peak is None if device == "cpu" else peak > 0, (name, peak)
    stages = result["stages"]
    assert stages["rft"]["pass_rate"] > 0 and stages["rft"]["update_tokens_per_s"] > 0
    assert stages["rft"]["mean_reward_first"] is None and stages["value"]["clip_fraction"] is None
    assert stages["ppo"]["clip_fraction"] is not None and stages["ppo"]["gen_tokens_per_s"] > 0
    assert stages["ppo"]["mean_reward_first"] is not None and result["figure_of_merit"]["improved"] is not None
    assert result["heldout"]["episodes"] == len(result["heldout"]["per_task"]) >= 1


def test_each_trained_task_has_a_single_block_variant_opened_its_own_way():
    bench = _bench()
    for task in bench.GPU_TASKS:
        fast, slow = (bench.replay_turn(task, "cuda", sample) for sample in (0, 1))
        fast_source, slow_source = (turn["tool_calls"][0]["function"]["arguments"]["content"] for turn in (fast, slow))
        assert [fast_source, slow_source] == [bench.recorded_source(task, "cuda", sample) for sample in (0, 1)]
        assert fast["content"] == bench.FAST_OPENING and slow["content"] == bench.SLOW_OPENING
        assert fast["content"].split()[0] != slow["content"].split()[0]  # told apart at the first word
        assert "const int blocks = 1;" in slow_source and "const int blocks = 1;" not in fast_source, task
        assert len(slow_source.splitlines()) == len(fast_source.splitlines())  # only the launch line differs


def test_single_block_variant_names_the_file_without_one_launch_line(tmp_path):
    bench = _bench()
    path = tmp_path / "model_new.py"
    with pytest.raises(ValueError, match=r"model_new\.py: expected exactly one line 'const int blocks = \.\.\.;'.*found 0"):
        bench.single_block_variant("int main() { return 0; }\n", path)
    twice = "    const int blocks = 4;\n    const int blocks = 8;\n"
    with pytest.raises(ValueError, match="found 2"):
        bench.single_block_variant(twice, path)


def test_opening_shares_count_the_fast_openings_of_each_step(tmp_path):
    bench = _bench()
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()

    def episode(opening: str) -> str:
        return json.dumps({"messages": [{"role": "user", "content": "task"}, {"role": "assistant", "content": opening}]})

    steps = [[bench.FAST_OPENING, bench.SLOW_OPENING], [bench.FAST_OPENING, "garbled " + bench.FAST_OPENING],
             [bench.FAST_OPENING, bench.FAST_OPENING]]
    for number, openings in enumerate(steps, 1):
        (rollouts / f"step-{number:06d}.jsonl").write_text("".join(episode(o) + "\n" for o in openings))
    assert bench.opening_shares(tmp_path) == [0.5, 0.5, 1.0]
    assert bench.opening_shares(tmp_path / "missing") == []

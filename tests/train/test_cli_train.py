"""``cuda-agent train``: usage errors exit 2 naming the field; ``train all`` runs the four stages
end to end (keypad environment, tiny model) and a rerun skips them; the kernel environment runs
warm-up and agentic PPO on the CPU backend with real workdirs and the trusted evaluator."""

from __future__ import annotations

import json
import sys

import yaml
from PIL import Image
from typer.testing import CliRunner

from cuda_agent.cli import app

from support import EXAMPLES

ENV = {"COLUMNS": "300", "NO_COLOR": "1"}


def invoke(*args):
    return CliRunner().invoke(app, ["train", *map(str, args)], env=ENV)


def write(path, data) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_unknown_key_wrong_type_and_invalid_value_exit_2_naming_the_field(tmp_path):
    for data, expected in (({"ppo": {"algorithm": {"clip_hi": 0.3}}}, "ppo.algorithm: unknown keys ['clip_hi']"),
                           ({"ppo": {"steps": "ten"}}, "ppo.steps: must be an integer"),
                           ({"ppo": {"algorithm": {"clip_low": 1.5}}}, "ppo.algorithm: clip_low must be in [0, 1)"),
                           ({"model": {"critic": "twin"}}, "critic must be one of ('separate', 'shared')"),
                           ({"agent": {"max_turns": 0}}, "agent.max_turns must be >= 1"),
                           ({"timing": {"budget_z": 1}}, "unknown keys ['budget_z']"),
                           ({"stages": {}}, "unknown keys ['stages']")):
        result = invoke("ppo", "--out", tmp_path / "out", "--model", tmp_path, "--config",
                        write(tmp_path / "c.yaml", data))
        assert result.exit_code == 2, (data, result.output)
        assert expected in " ".join(result.output.split()), (data, result.output)


def test_from_a_folder_that_is_no_stage_output_exits_2(tmp_path):
    result = invoke("rft", "--out", tmp_path / "out", "--from", tmp_path)
    assert result.exit_code == 2 and "not a training stage's output" in result.output


def test_train_all_runs_the_four_stages_on_keypad_and_a_rerun_skips_them(keypad_model, keypad_demos, tmp_path):
    config = write(tmp_path / "all.yaml", {
        "environment": {"name": "keypad", "keypad": {"tasks": 6, "codes": ["7"]}},
        "model": {"path": str(keypad_model), "critic": "separate"},
        "warmup": {"steps": 2, "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_new_tokens": 8},
                   "tensorboard": False},
        "rft": {"trajectories": [str(keypad_demos)], "rollout": {"tasks_per_step": 2, "samples_per_task": 1,
                                                                  "max_new_tokens": 8},
                "epochs": 1, "batch_size": 8, "tensorboard": False},
        "value": {"steps": 2, "rollout": {"tasks_per_step": 2, "samples_per_task": 1, "max_new_tokens": 8},
                  "tensorboard": False},
        "ppo": {"steps": 2, "rollout": {"tasks_per_step": 2, "samples_per_task": 1, "max_new_tokens": 8}},
    })
    result = invoke("all", "--config", config, "--out", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    stages = json.loads(result.output.strip().splitlines()[-1])
    assert [(s["stage"], s["completed"], s["already_done"]) for s in stages] == [
        ("warmup", True, False), ("rft", True, False), ("value", True, False), ("ppo", True, False)]
    run = tmp_path / "run"
    records = {name: json.loads((run / name / "stage.json").read_text()) for name in ("warmup", "rft", "value", "ppo")}
    assert records["rft"]["input"] == str((run / "warmup").resolve())
    assert records["value"]["actor"] == str((run / "rft" / "actor").resolve())  # value freezes the actor it got
    assert records["ppo"]["critic"] == str((run / "ppo" / "critic").resolve())
    assert json.loads((run / "rft" / "filter.json").read_text())["kept"] >= 1
    assert (run / "ppo" / "tensorboard").is_dir() and (run / "ppo" / "rollouts" / "step-000002.jsonl").is_file()
    ppo_metrics = [json.loads(line) for line in (run / "ppo" / "metrics.jsonl").open()]
    assert all(row["rollout/generation_tokens_per_s"] > 0 and row["update/tokens_per_s"] > 0 for row in ppo_metrics)
    assert all(1 <= row["rollout/generation_calls"] <= row["episodes"] * row["episodes/turns_mean"]
               and row["rollout/decode_step_seconds"] > 0 for row in ppo_metrics)  # at most one call per turn
    assert all(row["episodes/harness_errors"] == 0 and 0 <= row["step/verdict_blocked_share"] < 1
               and "actor/clip_fraction" in row for row in ppo_metrics)
    again = invoke("all", "--config", config, "--out", run, "--json")
    assert [s["already_done"] for s in json.loads(again.output.strip().splitlines()[-1])] == [True] * 4
    plotted = invoke("plot", run)
    assert plotted.exit_code == 0, plotted.output
    with Image.open(run / "learning_curve.png") as image:  # reward, clip fraction, KL, critic and SFT loss panels
        assert image.format == "PNG" and image.size[0] >= 600 and image.size[1] >= 5 * 200
    assert invoke("plot", run / "ppo", "--out", tmp_path / "ppo.png").exit_code == 0
    assert (tmp_path / "ppo.png").stat().st_size > 10_000


def test_plot_without_metrics_or_without_matplotlib_exits_2_saying_what_to_do(tmp_path, monkeypatch):
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2 and "no metrics.jsonl" in result.output
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 1.0}) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2 and "pip install 'cuda-agent[train]'" in " ".join(result.output.split())


def test_without_the_train_extra_init_model_and_all_exit_2_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    config = write(tmp_path / "all.yaml", {"environment": {"name": "keypad", "keypad": {"tasks": 2, "codes": ["7"]}}})
    for args in (("init-model", tmp_path / "model"),
                 ("all", "--config", config, "--model", tmp_path / "model", "--out", tmp_path / "out")):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.strip() == ("error: transformers is not installed: training needs the train extra "
                                         "(pip install 'cuda-agent[train]')"), args


def test_plot_gives_each_stage_its_own_step_axis() -> None:
    """RFT's 400 steps beside PPO's 8: PPO's column spans its own steps, not the last 2 % of 408."""
    import matplotlib.pyplot as plt

    from cuda_agent.train.plot import draw

    histories = {"rft": [{"step": i, "sft/loss": 1 / i} for i in range(1, 401)],
                 "ppo": [{"step": i, "reward/mean": i / 8} for i in range(1, 9)]}
    figure = draw(histories, "run")
    rft_column, ppo_column = figure.axes[0::2], figure.axes[1::2]  # rows: mean reward, SFT loss
    assert all(axis.get_xlim()[1] > 400 for axis in rft_column) and all(axis.get_xlim()[1] < 9 for axis in ppo_column)
    assert [axis.get_title() for axis in figure.axes[:2]] == ["rft (400 steps)", "ppo (8 steps)"]
    plt.close(figure)


def test_kernel_environment_warmup_and_ppo_on_the_cpu_backend(keypad_model, tmp_path, session_cache_dir):
    config = write(tmp_path / "cuda.yaml", {
        "environment": {"name": "cuda", "tasks": str(EXAMPLES / "tasks"), "task_limit": 2},
        "model": {"critic": "shared"}, "device": "cpu", "cache_dir": str(session_cache_dir),
        "timing": {"budget_s": 0.3, "min_samples": 3, "warmup_calls": 1, "compile_baseline": False},
        "agent": {"max_turns": 2, "max_idle_replies": 2, "work_root": str(tmp_path)},
        "warmup": {"steps": 1, "rollout": {"tasks_per_step": 2, "samples_per_task": 1, "max_new_tokens": 8},
                   "tensorboard": False},
        "ppo": {"steps": 1, "rollout": {"tasks_per_step": 1, "samples_per_task": 2, "max_new_tokens": 8},
                "tensorboard": False},
    })
    warm = invoke("warmup", "--config", config, "--model", keypad_model, "--out", tmp_path / "warmup", "--json")
    assert warm.exit_code == 0, warm.output
    ppo = invoke("ppo", "--config", config, "--from", tmp_path / "warmup", "--out", tmp_path / "ppo", "--json")
    assert ppo.exit_code == 0, ppo.output
    episodes = [json.loads(line) for line in (tmp_path / "ppo" / "rollouts" / "step-000001.jsonl").open()]
    assert len(episodes) == 2
    for episode in episodes:
        assert episode["final"]["op"] == "final" and episode["reward"] == -1  # the starter model_new.py, unchanged
        assert episode["final"]["verdict"]["device"] == "cpu"
        assert all(step["completion_token_ids"] for step in episode["steps"])

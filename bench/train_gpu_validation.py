"""GPU validation of the trainer (issue 6): each stage for a few steps, then one ``train all``.

A randomly initialised ~110M-parameter Llama (``cuda-agent train init-model --size 100m``, its BPE
tokenizer trained on the synth sample's sources and the agent's prompts: no download) trains in
bf16 mixed precision on real tasks from ``examples/data/synth-h100-sample`` with the kernel
environment on the GPU. Every step runs the user-facing command as a subprocess with a time
limit, so each invocation finishes within ``--budget-s`` (default 480 s):

- ``prepare``: the random model, and two recorded CUDA replay episodes (rmsnorm, relu from
  ``tests/fixtures/agent``) through ``cuda-agent agent run``: real trajectories with real rewards,
  which RFT adds to what it samples (a random model's own episodes never reach reward 2);
- ``warmup``, ``rft``, ``value``, ``ppo``: ``cuda-agent train <stage>``, each from the previous
  stage's folder (run them in this order);
- ``all``: ``cuda-agent train all`` on a fresh folder with one config.

Per stage it reports tokens/s of the rollouts (generated tokens per second of generation), of the
scoring pass (old log-probs and values) and of the PPO/SFT update (tokens through forward and
backward per second), peak GPU memory, steps and wall time; the rows go to
``<out>/train-gpu-validation.json`` (steps of separate invocations are merged) and a Markdown table
is printed for docs/gpu-validation.md.

    python bench/train_gpu_validation.py prepare --out runs/train-gpu
    python bench/train_gpu_validation.py warmup --out runs/train-gpu     # then rft, value, ppo, all
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "data" / "synth-h100-sample" / "tasks.parquet"
AGENT_FIXTURES = REPO / "tests" / "fixtures" / "agent"
REPLAYS = {"cuda": (("rmsnorm", AGENT_FIXTURES / "rmsnorm_cuda_script.json"),
                    ("relu", AGENT_FIXTURES / "relu_cuda_script.json")),
           "cpu": (("rmsnorm", AGENT_FIXTURES / "rmsnorm_cpu.jsonl"),)}
STAGES = ("warmup", "rft", "value", "ppo")
STEPS = ("prepare", *STAGES, "all")


def cli(args: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], capture_output=True, text=True,
                            timeout=timeout_s)
    return result, time.monotonic() - started


def train_config(out: Path, device: str) -> dict:
    """Small steps of every stage on the synth sample; bf16 mixed precision; short episodes."""
    rollout = {"tasks_per_step": 4, "samples_per_task": 2, "max_new_tokens": 512, "max_batch": 8, "concurrency": 8,
               "evaluation_slots": 2}
    return {
        "environment": {"name": "cuda", "tasks": str(SAMPLE)},
        "model": {"path": str(out / "model"), "critic": "separate",
                  "precision": "bf16-mixed" if device == "cuda" else "fp32"},
        "device": device,
        "agent": {"max_turns": 3, "max_idle_replies": 2, "context": {"window_tokens": 16384, "reply_tokens": 1024},
                  "wall_clock_s": 600},
        "warmup": {"steps": 4, "rollout": {**rollout, "max_new_tokens": 1024}, "checkpoint": {"every_steps": 2}},
        "rft": {"trajectories": [str(out / "replays" / "trajectories.jsonl")],
                "rollout": {**rollout, "tasks_per_step": 2, "samples_per_task": 1}, "epochs": 4, "batch_size": 2,
                "filter": {"min_reward": 1}},
        "value": {"steps": 3, "rollout": rollout, "checkpoint": {"every_steps": 3}},
        "ppo": {"steps": 4, "rollout": rollout, "checkpoint": {"every_steps": 2}},
    }


def prepare(out: Path, budget_s: float, device: str, size: str) -> dict:
    shutil.rmtree(out / "model", ignore_errors=True)
    result, model_s = cli(["train", "init-model", str(out / "model"), "--size", size, "--tasks", str(SAMPLE)], budget_s)
    if result.returncode != 0:
        raise SystemExit(f"init-model failed:\n{result.stderr[-3000:]}")
    print(result.stdout.strip(), flush=True)
    shutil.rmtree(out / "replays", ignore_errors=True)
    rewards = {}
    for task, script in REPLAYS[device]:
        result, _ = cli(["agent", "run", "--tasks", str(REPO / "examples" / "tasks" / f"{task}.py"), "--policy",
                         "replay", "--replay", str(script), "--out", str(out / "replays"), "--device", device],
                        budget_s)
        if result.returncode != 0:
            raise SystemExit(f"agent run (replay {task}) failed:\n{result.stderr[-3000:]}")
    for line in (out / "replays" / "trajectories.jsonl").read_text().splitlines():
        episode = json.loads(line)
        rewards[episode["task_id"]] = episode["reward"]
    print(f"replay rewards: {rewards}", flush=True)
    (out / "train.yaml").write_text(yaml.safe_dump(train_config(out, device)))
    return {"step": "prepare", "model_s": model_s, "model": result.stdout.strip(), "replay_rewards": rewards}


def stage_metrics(folder: Path) -> dict:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]

    def median(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    peak = [r["gpu/peak_memory_gb"] for r in rows if r.get("gpu/peak_memory_gb") is not None]
    return {"steps_logged": len(rows), "rollout_tokens_per_s": median("rollout/tokens_per_s"),
            "generation_tokens_per_s": median("rollout/generation_tokens_per_s"),
            "score_tokens_per_s": median("score/tokens_per_s"),
            "update_tokens_per_s": median("update/tokens_per_s") or median("sft/tokens_per_s"),
            "sft_tokens": median("sft/tokens"), "step_s": median("step_s"), "reward_mean": median("reward/mean"),
            "peak_gpu_memory_gb": max(peak) if peak else None, "last": rows[-1] if rows else {}}


def run_stage(out: Path, stage: str, budget_s: float) -> dict:
    folder = out / "stages" / stage
    shutil.rmtree(folder, ignore_errors=True)  # measure the stage, never a resumed run
    args = ["train", stage, "--config", str(out / "train.yaml"), "--out", str(folder), "--json",
            "--time-limit", f"{budget_s * 0.75 / 60:.2f}"]
    if stage != "warmup":
        args += ["--from", str(out / "stages" / STAGES[STAGES.index(stage) - 1])]
    result, wall_s = cli(args, budget_s)
    if result.returncode != 0:
        raise SystemExit(f"train {stage} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    outcome = json.loads(result.stdout.strip().splitlines()[-1])[0]
    print(f"{stage}: {'completed' if outcome['completed'] else 'stopped'} after {outcome['step']}/{outcome['steps']} "
          f"steps in {wall_s:.0f} s", flush=True)
    return {"step": stage, "wall_s": wall_s, "completed": outcome["completed"], "steps": outcome["step"],
            **stage_metrics(folder)}


def run_all(out: Path, budget_s: float) -> dict:
    folder = out / "all"
    shutil.rmtree(folder, ignore_errors=True)
    config = yaml.safe_load((out / "train.yaml").read_text())
    for stage in ("warmup", "value", "ppo"):
        config[stage]["steps"] = 2
    config["rft"]["epochs"] = 2
    (out / "train-all.yaml").write_text(yaml.safe_dump(config))
    result, wall_s = cli(["train", "all", "--config", str(out / "train-all.yaml"), "--out", str(folder), "--json",
                          "--time-limit", f"{budget_s * 0.75 / 60:.2f}"], budget_s)
    if result.returncode != 0:
        raise SystemExit(f"train all failed ({result.returncode}):\n{result.stderr[-4000:]}")
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"all: {[(o['stage'], o['completed']) for o in outcomes]} in {wall_s:.0f} s", flush=True)
    return {"step": "all", "wall_s": wall_s, "stages": [{"stage": o["stage"], "completed": o["completed"],
                                                          "steps": o["step"]} for o in outcomes],
            "completed": all(o["completed"] for o in outcomes) and len(outcomes) == len(STAGES),
            **{o["stage"]: stage_metrics(folder / o["stage"]) for o in outcomes}}


def environment() -> dict:
    import torch

    return {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=STEPS)
    parser.add_argument("--out", type=Path, default=Path("runs/train-gpu-validation"))
    parser.add_argument("--budget-s", type=float, default=480.0, help="Wall-clock limit of this invocation.")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="prepare: where candidates run (cpu: a mechanical dry run of this script).")
    parser.add_argument("--size", default="100m", help="prepare: the random model's size (tiny, small, 100m).")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step != "prepare" and not (args.out / "train.yaml").is_file():
        raise SystemExit(f"{args.out}: run the prepare step first")
    row = prepare(args.out, args.budget_s, args.device, args.size) if args.step == "prepare" else \
        run_all(args.out, args.budget_s) if args.step == "all" else run_stage(args.out, args.step, args.budget_s)
    summary_path = args.out / "train-gpu-validation.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {"rows": {}}
    summary["environment"] = environment()
    summary["rows"][args.step] = row
    summary_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(markdown(summary))


def markdown(summary: dict) -> str:
    lines = [f"GPU: {summary['environment']['gpu']}, torch {summary['environment']['torch']}, "
             f"CUDA {summary['environment']['cuda']}", "",
             "| stage | steps | wall s | rollout tok/s (end to end) | generation tok/s | score tok/s | update tok/s "
             "| peak GPU GB |", "|---|---|---|---|---|---|---|---|"]
    fmt = (lambda v: "—" if v is None else f"{v:.4g}")
    for name in STAGES:
        row = summary["rows"].get(name)
        if row:
            lines.append(f"| {name} | {row['steps']} | {row['wall_s']:.0f} | {fmt(row['rollout_tokens_per_s'])} | "
                         f"{fmt(row.get('generation_tokens_per_s'))} | "
                         f"{fmt(row['score_tokens_per_s'])} | {fmt(row['update_tokens_per_s'])} | "
                         f"{fmt(row['peak_gpu_memory_gb'])} |")
    if "all" in summary["rows"]:
        row = summary["rows"]["all"]
        lines += ["", f"train all: {'all four stages completed' if row['completed'] else row['stages']} "
                      f"in {row['wall_s']:.0f} s"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

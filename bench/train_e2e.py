"""End to end: the staged recipe on the real kernel environment, with a small random model (issue 16).

A random model never writes a correct kernel by chance, so the run is bootstrapped the way the
recipe intends: recorded successful trajectories seed RFT. Each invocation runs the next
unfinished step within ``--budget-s`` (default 540 s) and exits; run it again until it prints
``all steps done`` (every step resumes where the previous invocation stopped):

1. ``prepare``: the training tasks (bundled examples; the smoke run uses size variants of one),
   the held-out tasks (size variants synthesised here: the same operators with other module-level
   sizes; on CUDA also tasks of the synth sample), a random model whose tokenizer is trained on
   the tasks, solutions and prompts, and episodes of the replay policy scored by the real
   evaluator (``replays.jsonl``; the recording resumes per episode). Even samples write the
   bundled honest solution, odd ones the same kernel launched on a single block (correct, and
   far slower than eager PyTorch: reward 1), each after its own opening line, and finish. RFT
   keeps both (reward > 0), so its actor opens either way; what PPO can learn from the real
   reward is to open the fast way;
2. ``warmup``, ``rft`` (the recorded episodes; the smoke run also samples), ``value`` and ``ppo``:
   ``cuda-agent train``'s stages in ``stages/<name>`` (a stage stopped by the budget resumes
   from its checkpoint);
3. ``heldout``: the PPO actor's episodes on the held-out tasks.

After every step ``bench/results/train_e2e_<device>.json`` (``--results``) is rewritten: an object
``stages`` with, for warmup, rft, value and ppo, ``mean_reward_first`` and ``mean_reward_last``
(mean reward of the stage's first and last steps, a quarter of its steps each), ``pass_rate``
(share of its episodes with reward > 0), ``clip_fraction``, ``kl`` (mean approximate KL of
sampling to updated policy), ``gen_tokens_per_s``, ``update_tokens_per_s``, ``peak_gpu_gb`` (null
where a key does not apply), ``fast_opening_share_first``/``_last`` (share of the value and PPO
episodes opening the fast solution's way), plus the held-out reward and the figure of merit (PPO's
last steps against its first). ``--smoke`` shrinks everything to a CPU-sized mechanical check.

    python bench/train_e2e.py --out runs/e2e                      # repeat until "all steps done"
    python bench/train_e2e.py --out runs/e2e --stop-after rft     # prepare and RFT only (resume later)
    python bench/train_e2e.py --out runs/e2e-smoke --smoke --device cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import EXAMPLES, REPO, SMOKE_TIMING, machine_details, sample_solution, write_json  # noqa: E402

if TYPE_CHECKING:
    from cuda_agent.environment import EvalConfig

STAGES = ("warmup", "rft", "value", "ppo")
STEPS = ("prepare", *STAGES, "heldout")
GPU_TASKS = ("relu", "row_sum", "rmsnorm", "add_relu_mul")
"""The bundled examples trained on: short solutions (replies of up to ~2,000 tokens; matmul's would be
2,560). rmsnorm's and add_relu_mul's fused kernels beat eager PyTorch and torch.compile by far
(reward 3 on an H100); relu's and row_sum's are about as fast as eager (reward 1 or 3 by the
timing's noise). softmax is left out: its kernel ties eager (reward 1 on an H100, as its slow
variant), so it gives PPO no signal."""
SYNTH_SAMPLE = EXAMPLES / "data" / "synth-h100-sample" / "tasks.parquet"
SIZE_CONSTANT = re.compile(r"^([A-Za-z_]\w*) = (\d+)$", re.MULTILINE)
FAST_OPENING = "I will write a fused kernel and finish."
SLOW_OPENING = "A simple kernel on one block, then finishing."
"""The replies' first words tell the two solutions apart, so the actor chooses between them at its first token."""
LAUNCH_GRID = re.compile(r"^(\s*const int blocks = ).*;$", re.MULTILINE)


@dataclass(frozen=True)
class Plan:
    """The sizes of one run (``--smoke``: a mechanical CPU check; otherwise the GPU run)."""

    tasks: tuple[str, ...]
    train_scales: tuple[float, ...]
    """Size variants of every task for training (1.0: the bundled task itself)."""
    heldout_scales: tuple[float, ...]
    synth_heldout: int
    """Tasks of the synth sample added to the held-out set (CUDA only: its tasks were filtered on a GPU)."""
    episodes_per_task: int
    model_size: str
    steps: dict[str, int]
    tasks_per_step: int
    samples_per_task: int
    rft_epochs: int
    warmup_lr: float
    """Actor and critic learning rate of the warm-up (a random model: large steps are harmless)."""
    ppo_lr: float
    """The PPO actor's learning rate (the RFT actor has memorised its replies: large steps break them)."""
    lam: float
    """GAE's lambda in value pre-training and PPO (the paper's 0.95 needs a critic that already
    assigns credit; see GPU_PLAN)."""
    critic_lr: float
    """The critic's learning rate in value pre-training and PPO."""
    max_new_tokens: int | None
    """Tokens per turn; None: room for the longest recorded reply (a model that learned it can repeat it)."""
    rft_sample: bool
    """Whether RFT also samples episodes with the warm-up actor (besides the recorded ones)."""
    temperature: float
    """Sampling temperature of every stage (the PPO log-probabilities use the same one)."""


# Sized from H100 and H200 runs (2026-11-26/27). Preparing takes 208-232 s on a cold cache (the 8
# recorded solutions compile at once in ~125 s; one after another it took 258-380 s); an RFT step
# 0.1 s; a PPO step 60-107 s (16 episodes; 70-83 % of it waits for verdicts, scored one at a time).
# The 4 tasks at their own size: every step samples all four, so PPO's first and last steps compare
# the same tasks. RFT runs 400 epochs: after 40 every episode wrote unparsable calls; after 400
# (loss 0.001) all 16 passed at temperature 0.5, about half at 1.0.
# What PPO can learn here (docs/train.md, "End to end on the kernel environment"): with one recorded
# solution per task, the RFT actor's only failures at temperature 1 are slips (one unlikely token
# somewhere in a reply of ~1,300 tokens, then garbled text). No PPO setting tried (lr 3e-6 to 1e-4,
# GAE lambda 0.95 or 1, critics trained for up to 600 steps) made them rarer: the hundreds of
# garbled tokens after a slip carry the batch's largest gradients and average to zero. So the
# recorded episodes teach two correct solutions per task, fast (reward 1-3) and single-block (reward
# 1), chosen by the reply's first token, and sampling runs at temperature 0.5, where the RFT actor
# does not slip: PPO's signal is which solution the real reward favours. Its actor learns at 5e-6:
# at 1e-4 one update broke the memorised replies; at 1e-5 (H100, 2026-11-27) the fast share went
# from about half to all in 3 steps, and then the steps that only carried the timing's noise broke
# softmax's replies (reward -1 from step 5 on). GAE's lambda is 1 (every token gets the episode's
# reward minus the critic's value: the first token's choice needs no learned credit). RFT skips
# sampling: the warm-up actor of a random model passes no episode.
GPU_PLAN = Plan(GPU_TASKS, (1.0,), (0.5, 0.125), 4, 2, "small",
                {"warmup": 1, "value": 3, "ppo": 8}, 4, 4, 400, 1e-4, 5e-6, 1.0, 3e-4, None, False, 0.5)
SMOKE_PLAN = Plan(("relu",), (0.125, 0.0625), (0.03125,), 0, 1, "tiny",
                  {"warmup": 1, "value": 1, "ppo": 2}, 1, 1, 2, 1e-4, 1e-4, 1.0, 1e-4, 32, True, 1.0)


def scaled_task(code: str, scale: float) -> str:
    """``code`` with every module-level integer size constant (``batch_size = 1024``) scaled."""
    return SIZE_CONSTANT.sub(lambda m: f"{m.group(1)} = {max(1, round(int(m.group(2)) * scale))}", code)


def write_tasks(out: Path, plan: Plan, device: str) -> dict[str, list[str]]:
    """``tasks/train/*.py`` and ``tasks/heldout/*.py``; returns the ids of each set."""
    sets: dict[str, list[str]] = {"train": [], "heldout": []}
    for name, scales in (("train", plan.train_scales), ("heldout", plan.heldout_scales)):
        folder = out / "tasks" / name
        folder.mkdir(parents=True, exist_ok=True)
        for task in plan.tasks:
            code = (EXAMPLES / "tasks" / f"{task}.py").read_text()
            for scale in scales:
                task_id = task if scale == 1.0 else f"{task}_x{scale:g}".replace(".", "p")
                (folder / f"{task_id}.py").write_text(scaled_task(code, scale))
                sets[name].append(task_id)
    if device == "cuda" and plan.synth_heldout:
        import pyarrow.parquet as pq

        for row in pq.read_table(SYNTH_SAMPLE).to_pylist()[: plan.synth_heldout]:
            (out / "tasks" / "heldout" / f"synth_{row['id'][:12]}.py").write_text(row["code"])
            sets["heldout"].append(f"synth_{row['id'][:12]}")
    return sets


def solution_of(task_id: str, device: str) -> Path:
    return sample_solution(device, task_id.split("_x")[0], "single")


def single_block_variant(source: str, path: Path) -> str:
    """``source`` with its kernel launched on one block: the grid-stride loops keep it correct,
    and it is far slower than eager PyTorch on the training sizes (reward 1)."""
    slow, count = LAUNCH_GRID.subn(r"\g<1>1;  // one block: correct, slow", source)
    if count != 1:
        raise ValueError(f"{path}: expected exactly one line 'const int blocks = ...;' to launch on one block, "
                         f"found {count}")
    return slow


def recorded_source(task_id: str, device: str, sample: int) -> str:
    """What the recorded reply writes: the bundled honest solution (even ``sample``) or its
    single-block variant (odd)."""
    path = solution_of(task_id, device)
    return path.read_text() if sample % 2 == 0 else single_block_variant(path.read_text(), path)


def replay_turn(task_id: str, device: str, sample: int) -> dict[str, Any]:
    """The recorded reply: an opening line telling the two solutions apart, ``write_file`` of
    :func:`recorded_source` as ``model_new.py``, and ``finish``."""
    source = recorded_source(task_id, device, sample)
    return {"content": FAST_OPENING if sample % 2 == 0 else SLOW_OPENING,
            "tool_calls": [{"function": {"name": "write_file", "arguments": {"path": "model_new.py", "content": source}}},
                           {"function": {"name": "finish", "arguments": {"summary": "a custom kernel"}}}]}


def train_config(out: Path, plan: Plan, device: str, cache_dir: Path | None, max_new_tokens: int,
                 window_tokens: int, smoke: bool) -> dict[str, Any]:
    """The training YAML: non-paper learning rates and sizes (a random model, minutes per stage)."""
    rollout = {"tasks_per_step": plan.tasks_per_step, "samples_per_task": plan.samples_per_task,
               "max_new_tokens": max_new_tokens, "max_batch": 32, "concurrency": 32,
               "evaluation_slots": 1, "temperature": plan.temperature}  # one evaluation at a time per GPU: undisturbed timing
    tensorboard = not smoke
    # RL stages checkpoint every step: an invocation stopped by its caller loses one step at most.
    config: dict[str, Any] = {
        "environment": {"name": "cuda", "tasks": str(out / "tasks" / "train")},
        "model": {"path": str(out / "model"), "critic": "separate",
                  "precision": "bf16-mixed" if device == "cuda" else "fp32"},
        "device": device,
        "agent": {"max_turns": 2, "max_idle_replies": 1, "wall_clock_s": 600,
                  "context": {"window_tokens": window_tokens, "reply_tokens": max_new_tokens}},
        "warmup": {"steps": plan.steps["warmup"], "rollout": rollout, "actor_optim": {"lr": plan.warmup_lr},
                   "critic_optim": {"lr": plan.warmup_lr}, "checkpoint": {"every_steps": 1}, "tensorboard": tensorboard},
        "rft": {"trajectories": [str(out / "replays.jsonl")], "sample": plan.rft_sample, "rollout": rollout,
                "epochs": plan.rft_epochs, "batch_size": 8, "optim": {"lr": 1e-3}, "tensorboard": tensorboard,
                "checkpoint": {"every_steps": 20}},
        "value": {"steps": plan.steps["value"], "rollout": rollout, "algorithm": {"lam": plan.lam, "epochs": 4},
                  "critic_optim": {"lr": plan.critic_lr}, "checkpoint": {"every_steps": 1}, "tensorboard": tensorboard},
        "ppo": {"steps": plan.steps["ppo"], "rollout": rollout, "algorithm": {"lam": plan.lam},
                "actor_optim": {"lr": plan.ppo_lr}, "critic_optim": {"lr": plan.critic_lr},
                "checkpoint": {"every_steps": 1}, "tensorboard": tensorboard},
    }
    if cache_dir is not None:
        config["cache_dir"] = str(cache_dir)
    if smoke:
        config["timing"] = {"budget_s": SMOKE_TIMING.budget_s, "min_samples": SMOKE_TIMING.min_samples,
                            "warmup_calls": SMOKE_TIMING.warmup_calls, "warmup_ms": SMOKE_TIMING.warmup_ms,
                            "compile_baseline": SMOKE_TIMING.compile_baseline}
    return config


def prepare(out: Path, plan: Plan, device: str, cache_dir: Path | None, smoke: bool, deadline: float) -> bool:
    """Tasks, model, config, then the recorded episodes (resumable per episode); True when complete."""
    from cuda_agent.train.init_model import default_corpus, init_random_model

    state_path = out / "prepare.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    if "tasks" not in state:
        state["tasks"] = write_tasks(out, plan, device)
        sources = [(out / "tasks" / name / f"{t}.py").read_text() for name in ("train", "heldout")
                   for t in state["tasks"][name]]
        recorded = [(t, sample) for t in plan.tasks for sample in range(min(2, plan.episodes_per_task))]
        replies = [replay_turn(t, device, sample) for t, sample in recorded]
        solutions = [recorded_source(t, device, sample) for t, sample in recorded]
        turns = [json.dumps(reply) for reply in replies]
        init_random_model(out / "model", plan.model_size, default_corpus(sources + solutions * 4 + turns), seed=0,
                          max_positions=32768)
        reply = plan.max_new_tokens or _reply_tokens(out / "model", replies)
        prompt = _prompt_tokens(out / "model", out / "tasks" / "train", device)
        state.update(max_new_tokens=reply, window_tokens=(prompt + 3 * reply + 512) // 1024 * 1024 + 1024)
        state_path.write_text(json.dumps(state, indent=2))
    write_config(out, plan, device, cache_dir, smoke)
    return record_replays(out, plan, device, deadline)


def write_config(out: Path, plan: Plan, device: str, cache_dir: Path | None, smoke: bool) -> None:
    """``train.yaml`` from the plan and the prepared sizes, rewritten by every invocation: a stage
    not yet started runs with the plan of the code that starts it (a started stage refuses
    changed settings, naming them)."""
    import yaml

    state = json.loads((out / "prepare.json").read_text())
    (out / "train.yaml").write_text(yaml.safe_dump(
        train_config(out, plan, device, cache_dir, state["max_new_tokens"], state["window_tokens"], smoke)))


def _reply_tokens(model: Path, turns: list[dict[str, Any]]) -> int:
    """Room for the longest recorded reply as the text protocol renders it (rounded up to 128)."""
    from transformers import AutoTokenizer

    from cuda_agent.agent.text_protocol import render_for_text_model

    tokenizer = AutoTokenizer.from_pretrained(model)
    longest = 0
    for turn in turns:
        calls = [{"id": f"c{i}", "type": "function", "function": {"name": c["function"]["name"],
                                                                  "arguments": json.dumps(c["function"]["arguments"])}}
                 for i, c in enumerate(turn["tool_calls"])]
        rendered = render_for_text_model([{"role": "assistant", "content": turn["content"], "tool_calls": calls}], [])
        longest = max(longest, len(tokenizer.encode(rendered[-1]["content"])))
    return (int(longest * 1.25) // 128 + 1) * 128


def _prompt_tokens(model: Path, tasks: Path, device: str) -> int:
    """The longest first prompt (system prompt, tools, task) of the tasks in ``tasks``."""
    from transformers import AutoTokenizer

    from cuda_agent.agent.loop import initial_messages
    from cuda_agent.agent.text_protocol import render_for_text_model
    from cuda_agent.agent.tools import episode_tool_schemas
    from cuda_agent.environment import load_task

    tokenizer = AutoTokenizer.from_pretrained(model)
    longest = 0
    for path in sorted(tasks.glob("*.py")):
        messages = render_for_text_model(initial_messages(load_task(path), device), episode_tool_schemas())
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        longest = max(longest, len(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return longest


def record_replays(out: Path, plan: Plan, device: str, deadline: float) -> bool:
    """Episodes of the replay policy on every training task, scored by the real evaluator,
    appended to ``replays.jsonl`` as they finish; episodes already there are not run again."""
    from cuda_agent.agent.policies.replay_policy import ReplayPolicy
    from cuda_agent.agent.trajectory import append_trajectory, read_trajectories
    from cuda_agent.train.cli import load_config
    from cuda_agent.train.environments import evaluation_settings, make_environment

    path = out / "replays.jsonl"
    done = {t.episode_id for t in read_trajectories(path)} if path.is_file() else set()
    config = load_config(out / "train.yaml", None, None, None)
    environment = make_environment(config, config.ppo.rollout.evaluation_slots)
    jobs = [(task, sample) for task in environment.tasks for sample in range(plan.episodes_per_task)
            if f"replay-{task.id}-s{sample}" not in done]
    prebuild(out / "prebuild", [recorded_source(task.id, device, sample) for task, sample in jobs],
             evaluation_settings(config)[0])

    async def main() -> None:
        await environment.start()
        slots = asyncio.Semaphore(config.ppo.rollout.evaluation_slots * 2)

        async def one(task, sample: int) -> None:
            async with slots:
                if time.monotonic() > deadline:
                    return
                policy = ReplayPolicy([replay_turn(task.id, device, sample)], f"bundled solution of {task.id}")
                trajectory = await environment.episode(task, policy, f"replay-{task.id}-s{sample}", sample)
                append_trajectory(path, trajectory)
                print(f"recorded {trajectory.episode_id}: reward {trajectory.reward}", flush=True)

        try:
            await asyncio.gather(*(one(task, sample) for task, sample in jobs))
        finally:
            await environment.stop()

    try:
        asyncio.run(main())
    finally:
        environment.close()
    recorded = list(read_trajectories(path)) if path.is_file() else []
    return len(recorded) >= len(environment.tasks) * plan.episodes_per_task


def prebuild(folder: Path, sources: list[str], config: EvalConfig) -> None:
    """Compile the distinct recorded solutions all at once: their evaluations, one at a time in the
    evaluation slot, then find them in the build cache instead of compiling there one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from cuda_agent.environment import load_solution
    from cuda_agent.environment.build import CompileError, build_solution

    def build(path: Path) -> None:
        try:
            built = build_solution(load_solution(path), config.device, config.build, config.cache_dir, config.sandbox)
            print(f"prebuilt {path.parent.name}: " + ("cached" if built.info.cached else f"{built.info.seconds:.0f} s"),
                  flush=True)
        except CompileError as exc:  # its episode records the failure
            print(f"prebuild {path.parent.name} failed: {exc}", flush=True)

    paths = []
    for number, source in enumerate(dict.fromkeys(sources)):
        (folder / str(number)).mkdir(parents=True, exist_ok=True)
        paths.append(folder / str(number) / "model_new.py")
        paths[-1].write_text(source)
    if paths:
        with ThreadPoolExecutor(len(paths)) as pool:
            list(pool.map(build, paths))


def run_stage(out: Path, name: str, deadline: float) -> bool:
    """Run or resume stage ``name`` until it completes or ``deadline`` passes; True when completed."""
    from cuda_agent.train.cli import load_config
    from cuda_agent.train.stages import StageContext, StageOutput
    from cuda_agent.train.stages import run_stage as run_training_stage

    config = load_config(out / "train.yaml", None, None, None)
    previous = StageOutput.read(out / "stages" / STAGES[STAGES.index(name) - 1]) if name != "warmup" else None
    progress = (lambda stage, step, steps, metrics: print(
        f"{stage} {step}/{steps}: " + ", ".join(f"{k} {v:.3g}" for k, v in metrics.items()
                                                if k in ("reward/mean", "actor/clip_fraction", "sft/loss",
                                                         "critic/loss") and v is not None), flush=True))
    result = run_training_stage(name, StageContext(config, out / "stages" / name, previous, progress, None, deadline))
    return result.completed


def heldout(out: Path, device: str) -> bool:
    """The PPO actor's episodes on the held-out tasks (one per task), written to ``heldout.jsonl``."""
    from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy
    from cuda_agent.agent.trajectory import append_trajectory
    from cuda_agent.train.cli import load_config
    from cuda_agent.train.environments import make_environment
    from cuda_agent.train.rollout import collect_episodes
    from cuda_agent.train.stages import StageOutput

    config = load_config(out / "train.yaml", None, out / "tasks" / "heldout", None)
    actor = StageOutput.read(out / "stages" / "ppo").actor
    rollout = config.ppo.rollout
    environment = make_environment(config, rollout.evaluation_slots)
    try:
        policy = HFPolicy(HFConfig(model_path=actor, device=device, max_new_tokens=rollout.max_new_tokens,
                                   temperature=rollout.temperature, max_batch=rollout.max_batch,
                                   autocast="bfloat16" if device == "cuda" else None))
        episodes = collect_episodes(environment, policy, [(task, 0) for task in environment.tasks],
                                    rollout.concurrency, "heldout")
    finally:
        environment.close()
    path = out / "heldout.jsonl"
    path.unlink(missing_ok=True)
    for trajectory in episodes.trajectories:
        append_trajectory(path, trajectory)
    return True


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _standard_error(rows: list[dict[str, Any]]) -> float | None:
    """Standard error of the mean reward over the episodes of ``rows`` (their reward counts): how
    far two such means may differ by sampling alone."""
    rewards = [float(level) for r in rows for level in (-1, 1, 2, 3)
               for _ in range(int(r.get(f"reward/count_{level}", 0)))]
    return statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else None


def figure_of_merit(ppo: dict[str, Any]) -> dict[str, Any]:
    """PPO's last steps against its first (a quarter of its steps each), with the standard error of
    the difference: a difference within about two of them is what sampling alone gives."""
    first, last = ppo.get("mean_reward_first"), ppo.get("mean_reward_last")
    errors = (ppo.get("mean_reward_first_se"), ppo.get("mean_reward_last_se"))
    return {"ppo_mean_reward_first": first, "ppo_mean_reward_last": last,
            "improved": None if first is None or last is None else last > first,
            "difference": None if first is None or last is None else last - first,
            "difference_se": None if None in errors else (errors[0] ** 2 + errors[1] ** 2) ** 0.5}


def opening_shares(folder: Path) -> list[float]:
    """Per step of an RL stage (its ``rollouts/step-*.jsonl``), the share of episodes whose reply
    opens the way the fast solution's does: what PPO is expected to raise."""
    shares = []
    for path in sorted((folder / "rollouts").glob("step-*.jsonl")):
        episodes = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        openings = [next((m.get("content") or "" for m in e["messages"] if m["role"] == "assistant"), "")
                    for e in episodes]
        shares.append(sum(o.lstrip().startswith(FAST_OPENING) for o in openings) / len(openings) if openings else 0.0)
    return shares


def stage_summary(folder: Path, name: str) -> dict[str, Any] | None:
    """The per-stage keys of the results JSON from the stage's metrics (null where they do not apply)."""
    from cuda_agent.train.metrics import read_metrics

    rows = read_metrics(folder)
    if not rows:
        return None
    series = (lambda key: [r[key] for r in rows if isinstance(r.get(key), (int, float))])
    rewarded = [r for r in rows if isinstance(r.get("reward/mean"), (int, float))]
    rewards = [r["reward/mean"] for r in rewarded]
    quarter = max(1, len(rewards) // 4)
    positive = sum(sum(r.get(f"reward/count_{level}", 0) for level in (1, 2, 3)) for r in rows)
    scored = sum(r.get("episodes", 0) - r.get("episodes/unscored", 0) for r in rows)
    pass_rate = positive / scored if scored else None
    if name == "rft" and (folder / "filter.json").is_file():
        histogram = json.loads((folder / "filter.json").read_text())["reward_histogram"]
        total = sum(histogram.values())
        pass_rate = sum(n for r, n in histogram.items() if float(r) > 0) / total if total else None
    peak = series("gpu/peak_memory_gb")
    gen = series("rollout/generation_tokens_per_s")
    update = series("update/tokens_per_s") or series("sft/tokens_per_s")
    record = json.loads((folder / "stage.json").read_text()) if (folder / "stage.json").is_file() else {}
    fast = opening_shares(folder)
    return {"mean_reward_first": _mean(rewards[:quarter]), "mean_reward_last": _mean(rewards[-quarter:]),
            "mean_reward_first_se": _standard_error(rewarded[:quarter]),
            "mean_reward_last_se": _standard_error(rewarded[-quarter:]),
            "pass_rate": pass_rate, "clip_fraction": _mean(series("actor/clip_fraction")),
            "kl": _mean(series("actor/approx_kl")), "gen_tokens_per_s": statistics.median(gen) if gen else None,
            "outcome_value_gap": _mean(series("critic/outcome_value_gap")),
            "update_tokens_per_s": statistics.median(update) if update else None,
            "peak_gpu_gb": max(peak) if peak else None, "steps": len(rows), "status": record.get("status"),
            "verdict_wait_share": _mean(series("rollout/verdict_wait_share")),
            "decode_step_seconds": _mean(series("rollout/decode_step_seconds")),
            "generation_calls": sum(series("rollout/generation_calls")),
            "verdict_blocked_share": _mean(series("step/verdict_blocked_share")),
            "harness_errors": sum(series("episodes/harness_errors")),
            "sft_loss_first": _mean(series("sft/loss")[:quarter]) if name == "rft" else None,
            "sft_loss_last": _mean(series("sft/loss")[-quarter:]) if name == "rft" else None,
            "fast_opening_share_first": _mean(fast[:quarter]), "fast_opening_share_last": _mean(fast[-quarter:])}


def results(out: Path, plan: Plan, smoke: bool, steps_done: list[str], wall: dict[str, float]) -> dict[str, Any]:
    from cuda_agent.agent.trajectory import read_trajectories

    stages = {name: stage_summary(out / "stages" / name, name) for name in STAGES}
    replays = list(read_trajectories(out / "replays.jsonl")) if (out / "replays.jsonl").is_file() else []
    held = list(read_trajectories(out / "heldout.jsonl")) if (out / "heldout.jsonl").is_file() else []
    return {
        "machine": machine_details(), "smoke": smoke, "plan": plan.__dict__, "steps_done": steps_done,
        "step_wall_s": wall, "stages": stages,
        "recorded": {"episodes": len(replays), "successful": sum(t.reward > 0 for t in replays),
                     "rewards": {str(r): sum(t.reward == r for t in replays) for r in (-1, 1, 2, 3)}},
        "figure_of_merit": figure_of_merit(stages["ppo"] or {}),
        "heldout": {"episodes": len(held), "mean_reward": _mean([float(t.reward) for t in held]),
                    "pass_rate": _mean([float(t.reward > 0) for t in held]),
                    "per_task": {t.task_id: t.reward for t in held}} if held else None,
    }


def device_tag(device: str) -> str:
    """``h100``, ``h200``, ... from the GPU's name; ``cpu`` on the CPU backend."""
    if device != "cuda":
        return "cpu"
    import torch

    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", torch.cuda.get_device_name())
    return match.group(1).lower() if match else "gpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/train-e2e"), help="The run folder (resumed).")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="Default: cuda when visible.")
    parser.add_argument("--budget-s", type=float, default=540.0, help="Wall-clock budget of this invocation.")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes: a mechanical check of the pipeline.")
    parser.add_argument("--cache-dir", type=Path, default=None, help="The evaluator's build cache (shared).")
    parser.add_argument("--stop-after", choices=STEPS, default=None,
                        help="Stop once this step is done (e.g. prepare and RFT on one machine, the rest later).")
    parser.add_argument("--results", type=Path, default=None,
                        help="Default: bench/results/train_e2e_<device>.json (smoke: <out>/train_e2e.json).")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    plan = SMOKE_PLAN if args.smoke else GPU_PLAN
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    progress_path = args.out / "progress.json"
    progress = json.loads(progress_path.read_text()) if progress_path.is_file() else {"done": [], "wall_s": {}}
    if progress.get("smoke", args.smoke) != args.smoke or progress.get("device", device) != device:
        raise SystemExit(f"{args.out}: holds a run with smoke={progress['smoke']} on {progress['device']}; "
                         "use another --out")
    progress.update(smoke=args.smoke, device=device)
    if "prepare" in progress["done"]:
        write_config(args.out, plan, device, args.cache_dir, args.smoke)
    for step in STEPS:
        if step in progress["done"]:
            if step == args.stop_after:
                break
            continue
        if time.monotonic() >= deadline:
            break
        started = time.monotonic()
        print(f"== {step}", flush=True)
        if step == "prepare":
            finished = prepare(args.out, plan, device, args.cache_dir, args.smoke, deadline)
        elif step == "heldout":
            finished = heldout(args.out, device)
        else:
            finished = run_stage(args.out, step, deadline)
        progress["wall_s"][step] = progress["wall_s"].get(step, 0.0) + time.monotonic() - started
        if finished:
            progress["done"].append(step)
        progress_path.write_text(json.dumps(progress, indent=2))
        if not finished or step == args.stop_after:
            break
    summary = results(args.out, plan, args.smoke, progress["done"], progress["wall_s"])
    target = args.results or (args.out / "train_e2e.json" if args.smoke else
                              REPO / "bench" / "results" / f"train_e2e_{device_tag(device)}.json")
    write_json(summary, target)
    remaining = [s for s in STEPS if s not in progress["done"]]
    print(f"wrote {target}; " + ("all steps done" if not remaining else f"next: {remaining[0]} (run again)"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Seconds per decoding step of the ``hf`` policy (the trainer's rollouts), setting by setting.

A rollout step of the RL stages is bound by sequential decoding: every generation call takes
(longest completion) x (seconds per step), whatever the batch. This bench times that step for a
random model of a ``cuda-agent train init-model`` size, batch and prompt length as the trainer
uses them, in the settings that may change it: float32, float32 under bfloat16 autocast (the
``bf16-mixed`` rollouts), bfloat16 weights, and autocast with generation in a worker thread while
the CUDA environment is started beside it (as the trainer runs it). Each setting decodes a prompt
length of its own, so that none profits from what an earlier one cached per shape (cuDNN attention
plans: :mod:`cuda_agent.attention_backends`). It also keeps the profiler's top operations of one
autocast call, so a slow step can be traced to what it spends time on.

    python bench/generation_speed.py --device cuda --out bench/results/generation_speed_h100.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import EXAMPLES, machine_details, write_json  # noqa: E402


def step_seconds(policy: Any, prompts: list[tuple[int, ...]], sync: Any) -> dict[str, float]:
    """One generation call: its seconds, decoding steps and seconds per step."""
    sync()
    started = time.perf_counter()
    generations = policy.generate_batch(prompts)
    sync()
    seconds = time.perf_counter() - started
    steps = max(len(g.completion_ids) for g in generations)
    return {"seconds": round(seconds, 3), "steps": steps, "step_ms": round(1000 * seconds / steps, 2)}


def profile_top(policy: Any, prompts: list[tuple[int, ...]], rows: int = 15) -> str:
    """The profiler's table of one call's operations by CPU time (with device time beside it)."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        policy.generate_batch(prompts)
    return profile.key_averages().table(sort_by="cpu_time_total", row_limit=rows)


async def beside_environment(policy: Any, prompts: list[tuple[int, ...]], sync: Any, model: Path,
                             device: str) -> dict[str, float]:
    """A generation call in a worker thread (as the policy runs it) while the environment is started."""
    from cuda_agent.train.cli import load_config
    from cuda_agent.train.environments import make_environment

    config = load_config(None, model, EXAMPLES / "tasks", device)
    environment = make_environment(config, 1)
    await environment.start()
    try:
        return await asyncio.to_thread(step_seconds, policy, prompts, sync)
    finally:
        await environment.stop()
        environment.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="small", help="a model size of `cuda-agent train init-model`")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch

    from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy
    from cuda_agent.train.init_model import default_corpus, init_random_model

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    results: dict[str, Any] = {"machine": machine_details(), "size": args.size, "batch": args.batch,
                               "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        init_random_model(model, args.size, default_corpus(), seed=0, max_positions=32768)
        settings = {"float32": ("float32", None), "float32_autocast_bf16": ("float32", "bfloat16"),
                    "bfloat16": ("bfloat16", None)}
        traced = "float32_autocast_bf16" if args.device.startswith("cuda") else "float32"  # the trainer's setting
        for index, (name, (dtype, autocast)) in enumerate(settings.items()):
            if autocast and not args.device.startswith("cuda"):
                continue
            # a prompt length of its own per setting: no setting reuses what another cached per shape
            prompts = [tuple(5 + (i + j) % 2000 for j in range(args.prompt_tokens + 7 * index))
                       for i in range(args.batch)]
            policy = HFPolicy(HFConfig(model_path=model, device=args.device, dtype=dtype, autocast=autocast,
                                       max_new_tokens=args.new_tokens, temperature=1.0, seed=0))
            policy.generate_batch(prompts[:2])  # first call: kernels load, allocator grows
            results["settings"][name] = step_seconds(policy, prompts, sync)
            if name == traced:
                short = HFPolicy(dataclasses.replace(policy.config, max_new_tokens=16), policy.model, policy.tokenizer)
                results["profile_top"] = profile_top(short, prompts)
                results["settings"]["beside_environment"] = asyncio.run(
                    beside_environment(policy, [p + (5,) * 3 for p in prompts], sync, model, args.device))
        write_json(results, args.out)
    print("ms per decoding step: " + ", ".join(f"{name} {r['step_ms']}" for name, r in results["settings"].items())
          + f" -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The paper's released harness and cuda-agent's ``--preset paper``, side by side on honest kernels.

For each workdir in the released layout (``model.py``, ``model_new.py``, ``kernels/`` registering
with ``REGISTER_BINDING``), a scratch copy gets the released ``binding.cpp``,
``binding_registry.h`` and ``utils/`` from a checkout of BytedTsinghua-SIA/CUDA-Agent that you
fetched (they run unchanged; cuda-agent ships none of them), and ``bash utils/compile.sh``,
``python3 -m utils.verification`` and ``python3 -m utils.profiling`` run there. Their reward is
computed by the paper's rule from what they print: -1 unless compile and verification pass, else 1,
2 when (t_eager - t) / t_eager > 5 %, 3 when also against torch.compile. The same workdir is then
evaluated by cuda-agent under ``--preset paper`` (and ``strict`` for reference). Prints a Markdown
table for docs/gpu-validation.md and writes JSON.

    git clone https://github.com/BytedTsinghua-SIA/CUDA-Agent /tmp/CUDA-Agent
    python bench/paper_side_by_side.py --released /tmp/CUDA-Agent/agent_workdir \\
        --out bench/results/paper_side_by_side.json tests/fixtures/paper_workdir/cuda_*
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import device_label, machine_details, write_json

from cuda_agent.environment import EvalConfig, evaluate, load_task
from cuda_agent.environment.reward import milestone_reward

_TIMES = re.compile(r"Torch Baseline: ([0-9.]+)us, Torch Compile: ([0-9.]+)us, CUDA Extension: ([0-9.]+)us")
RELEASED_FILES = ("binding.cpp", "binding_registry.h", "utils")


def run_released(workdir: Path, released: Path, arch: str, timeout_s: float) -> dict:
    """Compile, verify and profile ``workdir`` with the released scripts in a scratch copy."""
    with tempfile.TemporaryDirectory(prefix="paper-harness-") as scratch:
        copy = Path(scratch) / workdir.name
        shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns(*RELEASED_FILES, "__pycache__"))
        for name in RELEASED_FILES:
            source = released / name
            (shutil.copytree if source.is_dir() else shutil.copy)(source, copy / name)
        env = {**os.environ, "TORCH_CUDA_ARCH_LIST": arch}
        steps = {}
        for name, command in (("compile", ["bash", "utils/compile.sh"]),
                              ("verify", [sys.executable, "-m", "utils.verification"]),
                              ("profile", [sys.executable, "-m", "utils.profiling"])):
            done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout_s)
            steps[name] = {"exit_code": done.returncode, "tail": (done.stdout + done.stderr)[-2000:]}
            if done.returncode != 0:
                return {"reward": -1, "failed_at": name, "steps": steps}
        match = _TIMES.search(steps["profile"]["tail"])
        if match is None:
            return {"reward": None, "failed_at": "parsing profiling.py's output", "steps": steps}
        eager_us, compile_us, candidate_us = map(float, match.groups())
        reward = milestone_reward(True, eager_us / candidate_us, compile_us / candidate_us, "time_saved")
        return {"reward": reward, "eager_us": eager_us, "compile_us": compile_us, "candidate_us": candidate_us,
                "steps": steps}


def run_ours(workdir: Path, preset: str, arch: str) -> dict:
    config = EvalConfig.from_dict({"device": "cuda", "preset": preset, "build": {"cuda_arch": arch}})
    verdict = evaluate(load_task(workdir / "model.py"), workdir, config)
    return {"reward": verdict.reward, "status": verdict.status.value, "eager_us": _us(verdict.eager_ms),
            "compile_us": _us(verdict.compile_ms), "candidate_us": _us(verdict.candidate_ms),
            "reward_baseline": verdict.reward_baseline, "error": verdict.error}


def _us(ms: float | None) -> float | None:
    return None if ms is None else 1000 * ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdirs", nargs="+", type=Path, help="Workdirs in the released layout, each with model.py.")
    parser.add_argument("--released", type=Path, required=True,
                        help="The released agent_workdir/ (binding.cpp, binding_registry.h, utils/).")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    missing = [name for name in RELEASED_FILES if not (args.released / name).exists()]
    if missing:
        sys.exit(f"{args.released}: no {', '.join(missing)}; give the released agent_workdir/ folder")
    import torch

    arch = ".".join(map(str, torch.cuda.get_device_capability()))
    rows = []
    print("| kernel | released reward | paper preset reward | strict reward | released t / t_eager / t_compile (µs) "
          "| paper preset t / t_eager / t_compile (µs) |\n|---|---|---|---|---|---|")
    for workdir in args.workdirs:
        released = run_released(workdir, args.released, arch, args.timeout_s)
        paper, strict = run_ours(workdir, "paper", arch), run_ours(workdir, "strict", arch)
        rows.append({"kernel": workdir.name, "released": released, "paper": paper, "strict": strict})
        print(f"| {workdir.name} | {released['reward']} | {paper['reward']} | {strict['reward']} | "
              f"{_times(released)} | {_times(paper)} |", flush=True)
    details = machine_details()
    write_json({"device": device_label(details), "machine": details, "rows": rows}, args.out)


def _times(result: dict) -> str:
    values = [result.get(key) for key in ("candidate_us", "eager_us", "compile_us")]
    return " / ".join("—" if v is None else f"{v:.4g}" for v in values)


if __name__ == "__main__":
    main()

"""Checkpoints that resume exactly: trainable weights, optimisers, schedulers, every RNG (Python,
NumPy, torch CPU and CUDA) and the data position, written atomically.

Layout: ``<stage out>/checkpoints/step-000010/state.pt``. A checkpoint is written to a
``.tmp`` folder and renamed into place, so a crash mid-write leaves the previous one intact; only
the newest ``keep_last`` are kept. Frozen weights are not stored: a resumed run rebuilds the
models from the stage's inputs, then loads the trainable ones on top.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.pt"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


def rng_state() -> dict[str, Any]:
    """Every random generator training draws from."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that training changes (frozen ones are rebuilt from the stage's inputs)."""
    return {name: p.detach().cpu().clone() for name, p in module.named_parameters() if p.requires_grad}


def load_trainable_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    parameters = dict(module.named_parameters())
    missing = sorted(set(state) - set(parameters))
    if missing:
        raise ValueError(f"checkpoint holds parameters the model does not have: {missing[:5]}")
    with torch.no_grad():
        for name, value in state.items():
            parameters[name].copy_(value)


def checkpoint_dirs(stage_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = stage_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if not p.name.endswith(".tmp") and (p / STATE_FILE).is_file())


def save_checkpoint(stage_dir: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    """Write ``state`` (plus the RNG states) as the checkpoint of ``step``; prune old ones."""
    root = stage_dir / CHECKPOINTS_DIR
    final = root / f"step-{step:06d}"
    partial = root / f"step-{step:06d}.tmp"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    torch.save({**state, "step": step, "rng": rng_state()}, partial / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for old in checkpoint_dirs(stage_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(stage_dir: Path) -> dict[str, Any] | None:
    """The newest checkpoint's state (with ``step`` and ``rng``), or ``None``."""
    found = checkpoint_dirs(stage_dir)
    if not found:
        return None
    return torch.load(found[-1] / STATE_FILE, map_location="cpu", weights_only=False)

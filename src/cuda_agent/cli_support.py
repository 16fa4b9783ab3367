"""What every ``cuda-agent`` command group shares: the consoles, the usage-error exit, the default
device and the evaluation config built from a YAML file and options."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console

from cuda_agent.environment import ConfigError, EvalConfig
from cuda_agent.environment.guards import GuardConfigError

EXIT_BAD_USAGE = 2

console = Console()
err_console = Console(stderr=True)


def fail_usage(message: str) -> NoReturn:
    """Print ``message`` as an error and exit with status 2 (bad usage or unreadable input)."""
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(EXIT_BAD_USAGE)


def default_device() -> str:
    """``cuda`` when a CUDA GPU is visible, else the CPU backend."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def read_yaml_config(path: Path) -> dict[str, Any]:
    """A YAML config file as a mapping of sections; exits 2 naming the file when it is not one."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        fail_usage(f"{path}: cannot read config ({exc})")
    if not isinstance(data, dict):
        fail_usage(f"{path}: config must be a mapping of sections (build, verify, timing, limits, ...)")
    return data


PRESET_HELP = ("Evaluation preset: strict (default: our verdict) or paper (the CUDA Agent paper's harness: "
               "atol=rtol=1e-2 on 5 inputs, profiler device time, PyTorch-default TF32 baselines, "
               "(t0-t)/t0 > 5% milestones). Config-file sections and options apply on top.")


def eval_config_from(data: dict[str, Any], device: Optional[str], precision: Optional[str] = None,
                     trials: Optional[int] = None, compile_baseline: Optional[bool] = None,
                     preset: Optional[str] = None) -> EvalConfig:
    """The evaluation config from parsed YAML sections and command-line overrides (exit 2 if invalid):
    the preset's settings first (``--preset``, else the file's ``preset`` key), then the file's
    sections, then the options."""
    data = dict(data)
    data.setdefault("device", device or default_device())
    if device:
        data["device"] = device
    if preset is not None:
        data["preset"] = preset
    verify = dict(data.get("verify") or {})
    if precision is not None:
        verify["precision"] = precision
    if trials is not None:
        verify["trials"] = trials
    data["verify"] = verify
    if compile_baseline is not None:
        data["timing"] = {**(data.get("timing") or {}), "compile_baseline": compile_baseline}
    try:
        return EvalConfig.from_dict(data)
    except (ConfigError, GuardConfigError, TypeError) as exc:
        fail_usage(f"invalid configuration: {exc}")


def build_eval_config(device: Optional[str], config_file: Optional[Path], precision: Optional[str] = None,
                      trials: Optional[int] = None, compile_baseline: Optional[bool] = None,
                      preset: Optional[str] = None) -> EvalConfig:
    """The ``EvalConfig`` of a command: the preset, the YAML file's sections, then the command-line
    options on top; exits 2 (naming the field) on an invalid value."""
    data = read_yaml_config(config_file) if config_file is not None else {}
    return eval_config_from(data, device, precision, trials, compile_baseline, preset)

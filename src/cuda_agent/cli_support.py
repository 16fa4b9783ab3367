"""What every ``cuda-agent`` command group shares: the consoles, the usage-error exit, the default
device and the evaluation config built from a YAML file and options."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from cuda_agent.environment import ConfigError, EvalConfig, timed_cpus
from cuda_agent.environment.guards import GuardConfigError

EXIT_BAD_USAGE = 2
EXIT_INTERRUPTED = 130
"""A run stopped by Ctrl-C or SIGTERM (the shell's 128 + SIGINT)."""
PIPED_COLUMNS = "120"
"""Width of output that is not a terminal (a log, a pipe) when ``COLUMNS`` does not say: rich's 80
would cut ``--help`` text short."""
PIPED_TABLE_COLUMNS = 250
"""Width of this module's stdout console off a terminal when ``COLUMNS`` does not say: nothing
reflows a log, so a table takes the width its cells need (at 120, a ten-column table folded its
names: "add_relu_m / ul") and only long text wraps."""

_PIPED = "COLUMNS" not in os.environ and not sys.stdout.isatty()
if _PIPED:
    os.environ["COLUMNS"] = PIPED_COLUMNS  # read by typer's help and the stderr console, created later
console = Console(width=PIPED_TABLE_COLUMNS if _PIPED else None)
err_console = Console(stderr=True)


def fail_usage(message: str) -> NoReturn:
    """Print ``message`` as an error and exit with status 2 (bad usage or unreadable input)."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # '[parquet]' is text, not markup
    raise typer.Exit(EXIT_BAD_USAGE)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Make SIGTERM stop the block as Ctrl-C does (``KeyboardInterrupt``): batch schedulers and
    timeouts send it before SIGKILL, and a run stopped this way closes its workers and keeps every
    result stored so far. Only the main thread may set a handler; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_device() -> str:
    """``cuda`` when a CUDA GPU is visible to a CUDA build of torch, else the CPU backend."""
    return "cuda" if cuda_visible() else "cpu"


def cuda_visible() -> bool:
    """Whether a CUDA GPU is visible to a CUDA build of torch, decided without importing torch
    (seconds the command's parent process never needs otherwise): the installed torch's build
    record, the NVIDIA driver's list of GPUs, ``CUDA_VISIBLE_DEVICES``."""
    import importlib.util
    import os
    import re

    spec = importlib.util.find_spec("torch")
    version_file = Path(spec.origin).parent / "version.py" if spec and spec.origin else None
    try:
        built_with_cuda = re.search(r"^cuda\b.*=\s*['\"]\d", version_file.read_text(), re.MULTILINE) is not None
    except (OSError, AttributeError):
        built_with_cuda = False
    gpus = Path("/proc/driver/nvidia/gpus")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1")
    return built_with_cuda and gpus.is_dir() and any(gpus.iterdir()) and not hidden


def require_local_device(config: EvalConfig) -> None:
    """Exit 2 when ``config`` asks for a GPU this machine does not have, or ``CUDA_AGENT_TIMED_CPU``
    names CPUs it cannot set apart (evaluating here would only end in errors)."""
    if config.device != "cuda":
        return
    if not cuda_visible():
        fail_usage("--device cuda: no CUDA GPU is visible on this machine (torch is a CPU build, the NVIDIA "
                   "driver lists no GPU, or CUDA_VISIBLE_DEVICES hides them); use --device cpu")
    try:
        timed_cpus.host_split()  # a bad CUDA_AGENT_TIMED_CPU is a usage error here, not a failure per evaluation
    except timed_cpus.TimedCpuError as exc:
        fail_usage(str(exc))


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

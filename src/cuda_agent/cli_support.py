"""What every ``cuda-agent`` command group shares: the consoles, the usage-error exit and the
default device."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

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

"""Output for readers who are not at a terminal: progress as one line per finished step, tables
that wrap instead of cutting, error messages whose bracketed text (``[parquet]``) survives."""

from __future__ import annotations

import re

import pytest
import typer
from rich.console import Console

from cuda_agent.cli_output import LineProgress, WrappingTable
from cuda_agent.cli_support import err_console, fail_usage


def test_line_progress_prints_a_line_as_a_step_begins_and_one_per_finished_step() -> None:
    console = Console(record=True, width=60, force_terminal=False)
    with LineProgress(console) as progress:
        step = progress.add_task("building", total=3)
        progress.advance(step)
        progress.update(step, description="building relu", advance=2)
        progress.update(step, description="renamed only")
    lines = console.export_text().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"\[\s*\d+\.\d s\] building: 0/3", lines[0])  # at once: a cold step may take a minute
    assert re.fullmatch(r"\[\s*\d+\.\d s\] building: 1/3", lines[1])
    assert re.fullmatch(r"\[\s*\d+\.\d s\] building relu: 3/3", lines[2])


def test_tables_wrap_long_cells_at_any_width() -> None:
    table = WrappingTable(title="t")
    table.add_column("task")
    table.add_row("add_relu_mul_with_a_long_name", "geomean_speedup_vs_compile")
    console = Console(record=True, width=24, force_terminal=False)
    console.print(table)
    text = console.export_text()
    assert "…" not in text and "geomean_" in text.replace("\n", "")


def test_usage_errors_keep_bracketed_text() -> None:
    with err_console.capture() as captured, pytest.raises(typer.Exit):
        fail_usage("install it with: pip install 'cuda-agent[parquet]'")
    assert "pip install 'cuda-agent[parquet]'" in captured.get()

"""``cuda-agent cache``: see and clear the cached baseline timings (``<cache>/baselines.sqlite``)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from cuda_agent.cli_output import CliApp, WrappingTable
from cuda_agent.cli_support import console, fail_usage
from cuda_agent.environment.baselines import BaselineCache, CachedBaseline, describe_age
from cuda_agent.environment.config import default_cache_dir

cache_app = CliApp(no_args_is_help=True, help="The cached eager and torch.compile baseline timings: what each one "
                                                 "is, how it was measured, and clearing them.")

_TASK_HELP = "Only this task's entries: its id as `cache show` lists it, or a prefix of its hash."
_CACHE_DIR_HELP = ("Cache root (default: $CUDA_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/cuda-agent, else "
                   "~/.cache/cuda-agent).")


def _entries(cache_dir: Optional[Path], task: Optional[str]) -> tuple[Path, list[CachedBaseline]]:
    """The cache file and its entries (those of ``task`` when given); exits 2 when ``task``
    matches none, naming the tasks there are."""
    path = (cache_dir or default_cache_dir()) / "baselines.sqlite"
    entries = BaselineCache(path).entries() if path.exists() else []
    if task is None:
        return path, entries
    matching = [e for e in entries if e.task == task or e.task_hash.startswith(task)]
    if not matching:
        known = sorted({e.task or e.task_hash[:12] for e in entries})
        fail_usage(f"no cached baseline of task {task!r} in {path}; cached: {', '.join(known) or 'none'}")
    return path, matching


@cache_app.command("show")
def show(
    task: Optional[str] = typer.Option(None, "--task", help=_TASK_HELP),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=_CACHE_DIR_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list of entries instead of a table."),
) -> None:
    """List the cached baselines: task, device, variant, median time, samples, the median's error,
    the timing budget, the machine's load and the age of each. A verdict reuses an entry only when
    it was timed at least as thoroughly as the verdict would time it, under a comparable load."""
    path, entries = _entries(cache_dir, task)
    now = time.time()
    if json_out:
        print(json.dumps([{**dataclasses.asdict(e), "age_s": None if e.timed_at is None else now - e.timed_at}
                          for e in entries], default=str))
        return
    if not entries:
        console.print(f"no cached baselines in {path}")
        return
    table = WrappingTable(title=f"{path}: {len(entries)} cached baselines")
    numbers = ("median ms", "n", "median ±", "budget s", "load")
    for column in ("task", "hash", "device", "variant", *numbers, "age"):
        table.add_column(column, justify="right" if column in numbers else "left")
    for e in entries:
        table.add_row(e.task or "—", e.task_hash[:12], e.device, e.variant, f"{e.stats.median_ms:.4g}",
                      str(e.stats.n),
                      "—" if e.stats.median_rel_err is None else f"{e.stats.median_rel_err:.2%}",
                      "—" if e.timing is None else f"{e.timing['budget_s']:g}",
                      "—" if e.load is None else f"{e.load:.2f}",
                      "—" if e.timed_at is None else describe_age(now - e.timed_at))
    console.print(table)


@cache_app.command("clear")
def clear(
    task: Optional[str] = typer.Option(None, "--task", help=_TASK_HELP),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help=_CACHE_DIR_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Clear without asking (needed when input is not a terminal)."),
) -> None:
    """Remove cached baselines (every one, or one task's): the next verdict of their task times them again."""
    path, entries = _entries(cache_dir, task)
    if not entries:
        console.print(f"no cached baselines in {path}")
        return
    tasks = sorted({e.task_hash for e in entries})
    what = f"{len(entries)} cached baselines of {len(tasks)} task{'s' if len(tasks) != 1 else ''} from {path}"
    if not yes:
        if not sys.stdin.isatty():
            fail_usage(f"would remove {what}; pass --yes to confirm when input is not a terminal")
        typer.confirm(f"Remove {what}?", abort=True)
    removed = BaselineCache(path).clear(None if task is None else tasks)
    console.print(f"removed {removed} cached baseline{'s' if removed != 1 else ''}")

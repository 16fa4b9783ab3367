"""``cuda-agent warm``: the keep-warm evaluators that ``cuda-agent verify --keep-warm`` starts."""

from __future__ import annotations

import json
import time

import typer
from rich.table import Table

from cuda_agent.cli_output import CliApp
from cuda_agent.cli_support import console, fail_usage
from cuda_agent.warm.client import WarmError, running_daemons, stop_daemons

warm_app = CliApp(help="The keep-warm evaluators started by `cuda-agent verify --keep-warm` (this user's).",
                  no_args_is_help=True)


@warm_app.command("status")
def status(json_out: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table.")) -> None:
    """List the running keep-warm evaluators: device, evaluations served, age, idle limit."""
    try:
        daemons = running_daemons()
    except WarmError as exc:
        fail_usage(str(exc))
    if json_out:
        print(json.dumps(daemons))
        return
    if not daemons:
        console.print("no keep-warm evaluator is running")
        return
    table = Table("pid", "device", "evaluations", "running for", "exits after idle", "socket")
    for daemon in daemons:
        table.add_row(str(daemon["pid"]), daemon["device"], str(daemon["evaluations"]),
                      f"{time.time() - daemon['started']:.0f} s", f"{daemon['idle_s']:g} s", daemon["socket"])
    console.print(table)


@warm_app.command("stop")
def stop() -> None:
    """Stop every keep-warm evaluator of this user (each finishes the evaluation it is running)."""
    try:
        stopped = stop_daemons()
    except WarmError as exc:
        fail_usage(str(exc))
    console.print(f"stopped {stopped} keep-warm evaluator{'s' if stopped != 1 else ''}")

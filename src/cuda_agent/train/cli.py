"""``cuda-agent train warmup|rft|value|ppo|all``, ``init-model``, ``verl-data`` and ``plot``."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import Progress

from cuda_agent.cli_output import CliApp, PlainHelpGroup, WrappingTable, step_progress
from cuda_agent.cli_support import console, err_console, fail_usage, read_yaml_config

TRAIN_EXTRA_MODULES = frozenset({"transformers", "tokenizers", "peft", "tensorboard", "pyarrow", "matplotlib"})
"""What the ``train`` extra of pyproject.toml installs, by import name."""


class _TrainCommands(PlainHelpGroup):
    """The ``train`` commands: a module of the train extra that is not installed ends a command
    with one line naming the install (it was a 95-line traceback from deep in model loading)."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in TRAIN_EXTRA_MODULES:
                raise
            fail_usage(f"{exc.name} is not installed: training needs the train extra "
                       "(pip install 'cuda-agent[train]')")


train_app = CliApp(cls=_TrainCommands, no_args_is_help=True,
                   help="Train the agent: warm-up PPO -> RFT -> value pre-training -> agentic PPO (docs/train.md; "
                        "pip install 'cuda-agent[train]').")

EXIT_NOT_TRAINED = 1

_CONFIG = typer.Option(None, "--config", help="YAML: environment, model, agent, pool, the evaluation sections and "
                                              "one section per stage (docs/train.md).")
_OUT = typer.Option(..., "--out", help="The stage's output folder (rerun the same command to resume).")
_MODEL = typer.Option(None, "--model", help="Starting actor (a transformers folder); overrides model.path.")
_TASKS = typer.Option(None, "--tasks", help="Task set (dataset, folder or problem file); overrides environment.tasks.")
_DEVICE = typer.Option(None, "--device", help="Where candidates are evaluated: cuda or cpu (default: cuda if visible).")
_TIME_LIMIT = typer.Option(None, "--time-limit-min", "--time-limit",
                           help="In minutes: stop with a checkpoint after the step that passes it (rerun to resume).")
_JSON = typer.Option(False, "--json", help="Print the result as JSON.")


def _quiet_libraries() -> None:
    """transformers' own progress bars and load reports would break the rich progress display."""
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def load_config(path: Optional[Path], model: Optional[Path], tasks: Optional[Path], device: Optional[str],
                overrides: dict[str, Any] | None = None) -> Any:
    """The :class:`TrainConfig` of the YAML file with the command line on top; exits 2 naming the
    invalid field."""
    from cuda_agent.train.config import TrainConfig, TrainConfigError
    from cuda_agent.train.environments import evaluation_settings

    data = read_yaml_config(path) if path is not None else {}
    for section in ("model", "environment"):
        if section in data and not isinstance(data[section], dict):
            fail_usage(f"{path}: section {section!r} must be a mapping")
    if model is not None:
        data["model"] = {**data.get("model", {}), "path": str(model)}
    if tasks is not None:
        data["environment"] = {**data.get("environment", {}), "tasks": str(tasks)}
    if device is not None:
        data["device"] = device
    for (section, key), value in (overrides or {}).items():
        if value is not None:
            data[section] = {**(data.get(section) or {}), key: value}
    try:
        config = TrainConfig.from_dict(data, str(path or "command line"))
        evaluation_settings(config)
    except (TrainConfigError, ValueError, TypeError) as exc:
        fail_usage(f"invalid configuration: {exc}")
    return config


class _StageProgress:
    """A rich progress bar per stage, showing the latest reward or loss."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.bars = progress, {}

    def __call__(self, stage: str, step: int, steps: int, metrics: dict[str, float]) -> None:
        if stage not in self.bars:
            self.bars[stage] = self.progress.add_task(stage, total=steps)
        shown = [f"{name} {metrics[key]:.3g}" for key, name in (("reward/mean", "reward"), ("sft/loss", "loss"),
                                                               ("critic/loss", "value loss")) if key in metrics]
        self.progress.update(self.bars[stage], completed=step, description=f"{stage} {' '.join(shown)}".strip())


def _run(run: Any, json_out: bool) -> list[Any]:
    """Run ``run(on_step)`` under a progress display; usage errors exit 2, an RFT stage with
    nothing to train on exits 1."""
    from cuda_agent.environment import TaskLoadError
    from cuda_agent.train.models import ModelLoadError
    from cuda_agent.train.stages import StageError
    from cuda_agent.train.stages.rft import NothingToTrain

    _quiet_libraries()
    try:
        with step_progress(disable=json_out) as progress:
            return run(_StageProgress(progress))
    except NothingToTrain as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_NOT_TRAINED)
    except (StageError, ModelLoadError, TaskLoadError, KeyError, ValueError) as exc:
        fail_usage(str(exc).strip("'\""))


def _report(results: list[Any], json_out: bool) -> None:
    if json_out:
        print(json.dumps([{"stage": r.stage, "out_dir": str(r.out_dir), "completed": r.completed, "step": r.step,
                           "steps": r.steps, "stopped": r.stopped, "already_done": r.already_done,
                           "summary": r.summary} for r in results], default=str))
        return
    table = WrappingTable(title="training")
    for column in ("stage", "status", "steps", "last reward / loss", "folder"):
        table.add_column(column)
    for r in results:
        last = r.summary.get("last_step", {})
        value = last.get("reward/mean", last.get("sft/loss", last.get("critic/loss")))
        status = "done (earlier run)" if r.already_done else "done" if r.completed else f"stopped ({r.stopped})"
        table.add_row(r.stage, status, f"{r.step}/{r.steps}", "—" if value is None else f"{value:.4g}", str(r.out_dir))
    console.print(table)
    if not results[-1].completed:
        console.print("[yellow]stopped early: run the same command again to resume[/yellow]")


def _deadline(minutes: Optional[float]) -> Optional[float]:
    if minutes is None:
        return None
    if minutes <= 0:
        fail_usage(f"--time-limit-min must be > 0 (minutes), got {minutes}")
    return time.monotonic() + 60 * minutes


def _previous(folder: Optional[Path]) -> Any:
    from cuda_agent.train.stages import StageError, StageOutput

    if folder is None:
        return None
    try:
        return StageOutput.read(folder)
    except StageError as exc:
        fail_usage(str(exc))


def _stage_command(name: str, needs_previous: bool):
    def command(
        out: Path = _OUT,
        source: Optional[Path] = typer.Option(None, "--from", help="The previous stage's output folder."),
        config: Optional[Path] = _CONFIG, model: Optional[Path] = _MODEL, tasks: Optional[Path] = _TASKS,
        device: Optional[str] = _DEVICE, steps: Optional[int] = typer.Option(None, help="Override the stage's steps "
                                                                                         "(rft: epochs)."),
        time_limit: Optional[float] = _TIME_LIMIT, json_out: bool = _JSON,
    ) -> None:
        from cuda_agent.train.stages import StageContext, run_stage

        key = "epochs" if name == "rft" else "steps"
        train_config = load_config(config, model, tasks, device, {(name, key): steps})
        if needs_previous and source is None and train_config.model.path is None:
            fail_usage(f"train {name} needs --from (the previous stage's folder) or a starting model (--model)")
        context_kwargs = {"previous": _previous(source), "deadline": _deadline(time_limit)}
        results = _run(lambda on_step: [run_stage(name, StageContext(train_config, out, on_step=on_step,
                                                                     **context_kwargs))], json_out)
        _report(results, json_out)

    command.__doc__ = _STAGE_HELP[name]
    return command


_STAGE_HELP = {
    "warmup": "Single-turn PPO warm-up: the task is the prompt, one complete solution file the response.",
    "rft": "Rejection fine-tuning: sample (or read) trajectories, keep reward >= 2 without invalid calls or loops, "
           "fine-tune on their assistant tokens.",
    "value": "Value pre-training: the critic regresses GAE returns of the (frozen) actor's episodes.",
    "ppo": "Multi-turn agentic PPO through the agent loop, tool output masked from the losses.",
}
for _name, _needs in (("warmup", False), ("rft", True), ("value", True), ("ppo", True)):
    train_app.command(_name, help=_STAGE_HELP[_name])(_stage_command(_name, _needs))


@train_app.command("all")
def train_all(out: Path = _OUT, config: Optional[Path] = _CONFIG, model: Optional[Path] = _MODEL,
              tasks: Optional[Path] = _TASKS, device: Optional[str] = _DEVICE, time_limit: Optional[float] = _TIME_LIMIT,
              json_out: bool = _JSON) -> None:
    """All four stages in OUT/warmup, OUT/rft, OUT/value, OUT/ppo; finished stages are skipped."""
    from cuda_agent.train.stages import run_all

    train_config = load_config(config, model, tasks, device)
    if train_config.model.path is None:
        fail_usage("train all needs a starting model: model.path in the config, or --model")
    deadline = _deadline(time_limit)
    _report(_run(lambda on_step: run_all(train_config, out, on_step, deadline), json_out), json_out)


@train_app.command("init-model")
def init_model(
    out: Path = typer.Argument(..., help="Folder for the model and tokenizer."),
    size: str = typer.Option("tiny", help="tiny (~0.2M parameters), small (~6M) or 100m (~110M)."),
    tasks: Optional[Path] = typer.Option(None, help="Tasks whose sources join the tokenizer's training text."),
    seed: int = typer.Option(0), max_positions: int = typer.Option(32768, help="Longest sequence the model takes."),
) -> None:
    """Write a randomly initialised Llama and a BPE tokenizer trained on the agent's prompts (no download)."""
    from cuda_agent.environment import TaskLoadError, load_tasks
    from cuda_agent.train.init_model import SIZES, default_corpus, init_random_model

    if size not in SIZES:
        fail_usage(f"unknown size {size!r}; valid: {', '.join(SIZES.names())}")
    sources: list[str] = []
    if tasks is not None:
        try:
            sources = [r.task.code for r in load_tasks(tasks) if r.task is not None]
        except TaskLoadError as exc:
            fail_usage(str(exc))
    _quiet_libraries()
    with console.status(f"building a random {size} model"):
        count = init_random_model(out, size, default_corpus(sources), seed, max_positions)
    console.print(f"wrote a {size} model ({count / 1e6:.2f}M parameters) to {out}")


@train_app.command("verl-data")
def verl_data(
    out: Path = typer.Option(..., "--out", help="The parquet file to write."),
    tasks: Optional[Path] = typer.Option(None, help="Tasks for RL rows (dataset, folder or problem file)."),
    mode: str = typer.Option("agent", help="RL rows for the cuda_agent agent loop ('agent') or for "
                                           "single-turn warm-up ('single_turn')."),
    trajectories: Optional[list[Path]] = typer.Option(None, "--trajectories",
                                                      help="Write SFT rows (messages) from these trajectory files "
                                                           "instead (e.g. rft/kept.jsonl)."),
    device: str = typer.Option("cuda", help="The target device the prompts name."),
) -> None:
    """Write the parquet a verl trainer reads: RL rows from tasks, or SFT rows from trajectories."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cuda_agent.agent.trajectory import TrajectoryError, read_trajectories
    from cuda_agent.environment import TaskLoadError, load_tasks
    from cuda_agent.train.verl.data import AGENT_LOOPS, rl_rows, sft_rows

    if (tasks is None) == (not trajectories):
        fail_usage("give either --tasks (RL rows) or --trajectories (SFT rows)")
    if device not in ("cuda", "cpu"):
        fail_usage(f"--device must be cuda or cpu, got {device!r}")
    try:
        if trajectories:
            rows = sft_rows([t for path in trajectories for t in read_trajectories(path)])
        else:
            if mode not in AGENT_LOOPS:
                fail_usage(f"unknown --mode {mode!r}; valid: {', '.join(AGENT_LOOPS)}")
            rows = rl_rows([r.task for r in load_tasks(tasks) if r.task is not None], device, mode)
    except (TrajectoryError, TaskLoadError) as exc:
        fail_usage(str(exc))
    if not rows:
        fail_usage("nothing to write: no loadable task or trajectory")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    console.print(f"wrote {len(rows)} rows to {out}")


@train_app.command("plot")
def plot(
    run_dir: Path = typer.Argument(..., help="A stage's output folder, or a 'train all' folder."),
    out: Optional[Path] = typer.Option(None, "--out", help="The PNG to write (default RUN_DIR/learning_curve.png)."),
) -> None:
    """Draw the learning curves (reward, clip fraction, KL, critic and SFT loss) from metrics.jsonl."""
    from cuda_agent.train.plot import PlotError, plot_run

    try:
        written = plot_run(run_dir, out)
    except PlotError as exc:
        fail_usage(str(exc))
    console.print(f"wrote {written}")

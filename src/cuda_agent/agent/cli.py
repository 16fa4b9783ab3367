"""``cuda-agent optimize``, ``cuda-agent agent run`` and ``cuda-agent traj show|stats``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import typer

from cuda_agent.agent.config import AgentConfig, AgentConfigError
from cuda_agent.agent.model_import import PACKAGED_MODELS
from cuda_agent.agent.policies import POLICIES, PolicySpec, make_policy
from cuda_agent.agent.runner import RunnerConfig
from cuda_agent.agent.trajectory import Trajectory, TrajectoryError, read_trajectories, summarize
from cuda_agent.cli_output import CliApp, WrappingTable, step_progress
from cuda_agent.cli_support import PRESET_HELP, console, err_console, eval_config_from, fail_usage, read_yaml_config
from cuda_agent.environment import EvalConfig, TaskLoadError, load_task, load_tasks

agent_app = CliApp(no_args_is_help=True, help="Run the agent over task sets.")
traj_app = CliApp(no_args_is_help=True, help="Inspect trajectories (JSONL, one episode per line).")

_AGENT_SECTIONS = ("agent", "policy", "runner")
_POLICY_HELP = f"Policy backend: {', '.join(POLICIES.names())}."
_PACKAGED_MODELS_HELP = ", ".join(f"{name} ({model.description}; {model.install})"
                                  for name, model in ((n, PACKAGED_MODELS.get(n)) for n in PACKAGED_MODELS))


@dataclasses.dataclass(frozen=True)
class _Setup:
    agent: AgentConfig
    eval: EvalConfig
    runner: RunnerConfig
    policy: PolicySpec


def _setup(config: Optional[Path], device: Optional[str], policy: str, model: Optional[str],
           base_url: Optional[str], replay: Optional[Path], tool_protocol: str, max_turns: Optional[int],
           runner_overrides: dict[str, Any] | None = None, preset: Optional[str] = None,
           agent_overrides: dict[str, Any] | None = None) -> _Setup:
    """All configs from the YAML file (sections agent, policy, runner + the evaluation sections)
    and the command line; exits 2 naming what is invalid."""
    data = read_yaml_config(config) if config is not None else {}
    origin = str(config or "command line")
    sections = {name: data.pop(name, None) or {} for name in _AGENT_SECTIONS}
    for name, section in sections.items():
        if not isinstance(section, dict):
            fail_usage(f"{origin}: section {name!r} must be a mapping")
    if policy not in POLICIES:
        fail_usage(f"unknown policy {policy!r}; valid: {', '.join(POLICIES.names())}")
    try:
        agent = AgentConfig.from_dict({**sections["agent"], **{k: v for k, v in (agent_overrides or {}).items()
                                                              if v is not None}}, f"{origin}: agent")
        if max_turns is not None:
            agent = agent.replace(max_turns=max_turns)
        runner = RunnerConfig(**{**sections["runner"], **{k: v for k, v in (runner_overrides or {}).items()
                                                         if v is not None}})
    except (AgentConfigError, TypeError) as exc:
        fail_usage(f"invalid configuration: {exc}")
    spec = PolicySpec(policy, model=model, base_url=base_url, replay=replay, tool_protocol=tool_protocol,
                      settings=sections["policy"])
    return _Setup(agent, eval_config_from(data, device, preset=preset), runner, spec)


def _make_policy(spec: PolicySpec):
    try:
        return make_policy(spec)
    except Exception as exc:  # every backend's config/load error is bad usage here, named by its message
        fail_usage(f"cannot create the {spec.name} policy: {exc}")


AGENT_OPTIONS = {
    "policy": typer.Option("openai", help=_POLICY_HELP),
    "model": typer.Option(None, help="openai: model name (else $CUDA_AGENT_LLM_MODEL); hf: local model folder."),
    "base_url": typer.Option(None, help="openai: endpoint, e.g. http://localhost:8000/v1 (else "
                                        "$CUDA_AGENT_LLM_BASE_URL / $OPENAI_BASE_URL). Key: $CUDA_AGENT_LLM_API_KEY."),
    "replay": typer.Option(None, help="replay: a trajectory .jsonl or a replay script .json."),
    "tool_protocol": typer.Option("native", help="openai: 'native' tool calls, or 'text' for servers without them."),
    "device": typer.Option(None, help="cuda or cpu (default: cuda if a GPU is visible, else cpu)."),
    "config": typer.Option(None, help="YAML with sections agent, policy, runner and the evaluation sections "
                                      "(build, verify, timing, limits, guards, sandbox); see docs/agent.md."),
    "max_turns": typer.Option(None, help="Assistant turns per episode (default 150)."),
    "preset": typer.Option(None, help=PRESET_HELP),
    "workdir_style": typer.Option(None, "--workdir-style", help="default (cuda-agent's workdir and tools) or paper "
                                                              "(the paper's released workdir, tools and SKILL.md; "
                                                              "needs --skill)."),
    "skill": typer.Option(None, "--skill", help="SKILL.md to give the agent (required with --workdir-style paper: the "
                                                "released agent_workdir/SKILL.md)."),
    "solution": typer.Option("final", help="Which solution of the episode is written and scored: final (the final "
                                           "workdir, as training rewards it) or best (the best profiled one)."),
}


def optimize(
    model_file: Path = typer.Argument(..., metavar="MODEL.py", help="KernelBench-format problem (class Model, get_inputs, get_init_inputs)."),
    out: Path = typer.Option(Path("optimized"), help="Folder for model_new.py (+ kernels/), report.json, trajectory.jsonl."),
    policy: str = AGENT_OPTIONS["policy"], model: Optional[str] = AGENT_OPTIONS["model"],
    base_url: Optional[str] = AGENT_OPTIONS["base_url"], replay: Optional[Path] = AGENT_OPTIONS["replay"],
    tool_protocol: str = AGENT_OPTIONS["tool_protocol"], device: Optional[str] = AGENT_OPTIONS["device"],
    config: Optional[Path] = AGENT_OPTIONS["config"], max_turns: Optional[int] = AGENT_OPTIONS["max_turns"],
    preset: Optional[str] = AGENT_OPTIONS["preset"], solution: str = AGENT_OPTIONS["solution"],
    workdir_style: Optional[str] = AGENT_OPTIONS["workdir_style"], skill: Optional[Path] = AGENT_OPTIONS["skill"],
) -> None:
    """Let the agent optimise one PyTorch module; write the scored solution (--solution) and its report."""
    from cuda_agent.agent.optimize import SOLUTION_RULES
    from cuda_agent.agent.optimize import optimize as run_optimize

    if solution not in SOLUTION_RULES:
        fail_usage(f"--solution {solution!r} is unknown; valid: {', '.join(SOLUTION_RULES.names())}")
    setup = _setup(config, device, policy, model, base_url, replay, tool_protocol, max_turns, preset=preset,
                   agent_overrides={"workdir_style": workdir_style, "skill_path": skill})
    try:
        task = load_task(model_file)
    except TaskLoadError as exc:
        fail_usage(str(exc))
    agent_policy = _make_policy(setup.policy)

    async def run():
        try:
            return await run_optimize(task, agent_policy, setup.agent, setup.eval, out, solution_rule=solution)
        finally:
            await agent_policy.aclose()

    with console.status(f"agent optimising {task.id} on {setup.eval.device} with the {policy} policy"):
        result = asyncio.run(run())
    report = result.report
    table = WrappingTable(title=f"{task.id}: reward {report['reward']}", show_header=False)
    for name, value in (("correct", str(report["correct"])), ("candidate ms", _num(report["candidate_ms"])),
                        ("eager ms", _num(report["eager_ms"])), ("torch.compile ms", _num(report["compile_ms"])),
                        ("speed-up vs eager", _num(report["speedup_vs_eager"], "x")),
                        ("speed-up vs compile", _num(report["speedup_vs_compile"], "x")),
                        ("turns", f"{report['turns']} (ended: {report['end_reason']})"),
                        ("solution from", f"{report['solution_from']} (rule {solution})"),
                        ("preset", report.get("preset", "strict")), ("written to", str(out))):
        table.add_row(name, value)
    console.print(table)
    if not report["correct"]:
        err_console.print(f"[yellow]no correct solution;[/yellow] {out}/model_new.py is the {solution} rule's: "
                          f"{(report.get('error') or '').splitlines()[:1]}")


@agent_app.command("run")
def agent_run(
    tasks: Path = typer.Option(..., help="Tasks: a problem file, a folder of them, or a .parquet/.jsonl dataset."),
    out: Path = typer.Option(..., help="Output folder; trajectories go to OUT/trajectories.jsonl (a rerun resumes)."),
    policy: str = AGENT_OPTIONS["policy"], model: Optional[str] = AGENT_OPTIONS["model"],
    base_url: Optional[str] = AGENT_OPTIONS["base_url"], replay: Optional[Path] = AGENT_OPTIONS["replay"],
    tool_protocol: str = AGENT_OPTIONS["tool_protocol"], device: Optional[str] = AGENT_OPTIONS["device"],
    config: Optional[Path] = AGENT_OPTIONS["config"], max_turns: Optional[int] = AGENT_OPTIONS["max_turns"],
    samples: Optional[int] = typer.Option(None, help="Episodes per task (default 1)."),
    concurrency: Optional[int] = typer.Option(None, help="Episodes at once (default 8)."),
    evaluation_slots: Optional[int] = typer.Option(None, help="Evaluations at once over all episodes (default 1)."),
    limit: Optional[int] = typer.Option(None, help="Only the first N tasks."),
    preset: Optional[str] = AGENT_OPTIONS["preset"],
    workdir_style: Optional[str] = AGENT_OPTIONS["workdir_style"], skill: Optional[Path] = AGENT_OPTIONS["skill"],
) -> None:
    """Run episodes over a task set with a progress bar; rerunning with the same OUT resumes."""
    from cuda_agent.agent.runner import run_episodes

    setup = _setup(config, device, policy, model, base_url, replay, tool_protocol, max_turns,
                   {"samples_per_task": samples, "concurrency": concurrency, "evaluation_slots": evaluation_slots},
                   preset=preset, agent_overrides={"workdir_style": workdir_style, "skill_path": skill})
    try:
        results = load_tasks(tasks)
    except TaskLoadError as exc:
        fail_usage(str(exc))
    for bad in (r for r in results if r.task is None):
        err_console.print(f"[yellow]skipped:[/yellow] {bad.error}")
    task_list = [r.task for r in results if r.task is not None][:limit]
    if not task_list:
        fail_usage(f"{tasks}: no loadable tasks")
    agent_policy = _make_policy(setup.policy)
    out_path = out / "trajectories.jsonl"
    total = len(task_list) * setup.runner.samples_per_task

    with step_progress() as progress:
        bar = progress.add_task(f"episodes ({policy})", total=total)

        async def run():
            try:
                return await run_episodes(task_list, agent_policy, setup.agent, setup.eval, out_path, setup.runner,
                                          on_done=lambda _: progress.advance(bar))
            finally:
                await agent_policy.aclose()

        try:
            done_before = len(_existing(out_path))
        except TrajectoryError as exc:
            fail_usage(f"cannot resume: {exc}")
        progress.update(bar, completed=min(done_before, total))
        summary = asyncio.run(run())
    rewards = [t.reward for t in summary.written]
    console.print(f"{len(summary.written)} episode(s) written to {out_path}, {summary.skipped} already done"
                  + (f"; mean reward {sum(rewards) / len(rewards):.2f}" if rewards else ""))
    for task_id, sample, error in summary.failures:
        err_console.print(f"[red]failed:[/red] {task_id} sample {sample}: {error}")
    if summary.failures:
        raise typer.Exit(1)


@agent_app.command("import-model")
def import_model_command(
    source: str = typer.Argument(..., help=f"A GGUF file, or a packaged model: {_PACKAGED_MODELS_HELP}."),
    out: Optional[Path] = typer.Option(None, help="Folder to write (default: the cache, <cache dir>/models/)."),
) -> None:
    """Convert a GGUF model into a transformers folder once (cached) and print the folder: give it to
    --policy hf --model, to transformers serve, or to cuda-agent train --model."""
    from cuda_agent.agent.model_import import ModelImportError, import_model

    try:
        with err_console.status(f"converting {source} (once; later calls reuse it)"):
            folder = import_model(source, out)
    except ModelImportError as exc:
        fail_usage(str(exc))
    print(folder)


def _existing(path: Path) -> list[Trajectory]:
    return list(read_trajectories(path)) if path.exists() else []


def _num(value: Optional[float], unit: str = "") -> str:
    return "—" if value is None else f"{value:.4g}{unit}"


def _load(path: Path) -> list[Trajectory]:
    try:
        trajectories = list(read_trajectories(path))
    except TrajectoryError as exc:
        fail_usage(str(exc))
    if not trajectories:
        fail_usage(f"{path}: holds no trajectories")
    return trajectories


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else f"{text[:chars]} [... {len(text) - chars} more characters]"


@traj_app.command("show")
def traj_show(
    path: Path = typer.Argument(..., help="A trajectory JSONL file."),
    episode: int = typer.Option(0, help="Which line (0-based) of the file."),
    width: int = typer.Option(600, help="Characters shown of each message and tool result."),
) -> None:
    """Render one episode readably: turns, tool calls and results, evaluations, final verdict."""
    trajectories = _load(path)
    if not 0 <= episode < len(trajectories):
        fail_usage(f"{path}: has {len(trajectories)} episode(s); --episode {episode} does not exist")
    t = trajectories[episode]
    console.rule(f"{t.episode_id}: task {t.task_id} on {t.device}, policy {t.policy.get('name')} "
                 f"{t.policy.get('model', '')}".strip())
    console.print(f"reward [bold]{t.reward}[/bold], {t.turns} turns, ended by {t.end_reason}; tokens "
                  f"{t.tokens.get('prompt', 0)} prompt / {t.tokens.get('completion', 0)} completion; wall "
                  f"{t.timings.get('wall_s', 0):.1f} s; sandbox: {t.sandbox}", markup=True)
    if t.error:
        console.print(f"[red]error:[/red] {t.error}")
    for step in t.steps:
        message = t.messages[step.message_index]
        console.print(f"\n[bold cyan]turn {step.turn}[/bold cyan] ({step.completion_tokens} tokens, "
                      f"{step.policy_s:.2f} s){' [context trimmed]' if step.context else ''}")
        if message.get("content"):
            console.print(_clip(message["content"], width), markup=False)
        results = {m.get("tool_call_id"): m for m in t.messages[step.message_index + 1:step.message_index + 1
                                                                   + len(step.tool_calls)]}
        for call in step.tool_calls:
            mark = "" if call.ok else " [red](failed)[/red]"
            console.print(f"[green]→ {call.name}[/green] {_clip(call.arguments, width // 2)}{mark} "
                          f"[dim]{call.latency_s:.2f} s[/dim]")
            result = results.get(call.id)
            if result is not None:
                console.print(_clip(result["content"], width), markup=False, style="dim")
        for error in step.parse_errors:
            console.print(f"[red]unparsed tool call:[/red] {error}")
    final = t.final or {}
    console.rule("final (trusted evaluator)")
    console.print(final.get("summary", "no final evaluation"), markup=False)


@traj_app.command("stats")
def traj_stats(
    path: Path = typer.Argument(..., help="A trajectory JSONL file or a folder of them."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Summarise trajectories: reward histogram, turns, end reasons, tool calls and their errors."""
    stats = summarize(_load(path))
    if json_out:
        print(json.dumps(dataclasses.asdict(stats)))
        return
    table = WrappingTable(title=f"{path}: {stats.episodes} episode(s)", show_header=False)
    histogram = "  ".join(f"{reward:+d}: {count}" for reward, count in stats.reward_histogram.items())
    for name, value in (("reward histogram", histogram), ("mean reward", f"{stats.mean_reward:.3f}"),
                        ("turns mean / median", f"{stats.turns_mean:.1f} / {stats.turns_median:g}"),
                        ("end reasons", _counts(stats.end_reasons)), ("tool calls", _counts(stats.tool_calls)),
                        ("tool-call errors", _counts(stats.tool_errors) or "none"),
                        ("unparsed tool calls", str(stats.unparsed_tool_calls)),
                        ("evaluations", _counts(stats.evaluations) or "none"),
                        ("tokens prompt / completion", f"{stats.prompt_tokens} / {stats.completion_tokens}"),
                        ("env overhead per tool call (median)", _num(stats.env_overhead_s_median, " s"))):
        table.add_row(name, value)
    console.print(table)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items())

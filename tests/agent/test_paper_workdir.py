"""The paper's workdir style: its layout and protected utils/, its tools (multi_edit, background
shells), and a replayed episode that builds, verifies and profiles through utils/ on the CPU backend."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from cuda_agent.agent.config import AgentConfig, AgentConfigError, ToolConfig
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.policies.replay_policy import ReplayPolicy
from cuda_agent.agent.shell import SandboxedShell
from cuda_agent.agent.tools import episode_tools
from cuda_agent.agent.workdir import PAPER_PROTECTED_FILES, Workdir
from cuda_agent.environment import LimitsConfig, SandboxConfig, load_solution, load_task
from cuda_agent.environment.sandbox import processes_of

from scripts import call, turn
from support import FIXTURES

WORKDIR_FIXTURE = FIXTURES / "paper_workdir" / "cpu_axpby"
SKILL = "# Test skill\nCompile with bash utils/compile.sh; verify with python3 -m utils.verification.\n"


@pytest.fixture()
def skill_file(tmp_path: Path) -> Path:
    path = tmp_path / "SKILL.md"
    path.write_text(SKILL)
    return path


@pytest.fixture()
def paper_toolbox(tmp_path: Path):
    workdir = Workdir.create(tmp_path / "episode", load_task(WORKDIR_FIXTURE / "model.py"), "paper", SKILL)
    shell = SandboxedShell(workdir.path, workdir.home, SandboxConfig(), LimitsConfig(), workdir.root, workdir.bin_dir)
    if shell.uid is not None:
        workdir.hand_to(shell.uid)
    tools = episode_tools(workdir, shell, ToolConfig(max_output_chars=2000, bash_timeout_s=5.0), "paper")
    yield tools, workdir, shell
    shell.close()


def test_paper_style_needs_a_skill_file_and_lays_out_the_released_files(paper_toolbox, tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="needs agent.skill_path"):
        AgentConfig(workdir_style="paper")
    tools, workdir, _ = paper_toolbox
    assert (workdir.path / "SKILL.md").read_text() == SKILL
    for name in ("binding.cpp", "binding_registry.h", "utils/compile.sh", "utils/compile.py",
                 "utils/verification.py", "utils/profiling.py", "utils/__init__.py", "kernels"):
        assert (workdir.path / name).exists(), name
    assert {"multi_edit", "bash_start", "bash_output", "bash_kill"} <= set(tools.tools)

    async def scenario():
        refused = [await tools.call("write_file", json.dumps({"path": path, "content": "x"}))
                   for path in ("utils/verification.py", "binding_registry.h", "utils/new.py", "SKILL.md")]
        shell_edit = await tools.call("bash", json.dumps({"command": "echo x >> utils/profiling.py; sudo id -u"}))
        return refused, shell_edit
    refused, shell_edit = asyncio.run(scenario())
    assert all(not r.ok and "protected" in r.output for r in refused)
    if os.geteuid() == 0:  # the sandboxed shell is another uid: the kernel refuses, and sudo does not escalate
        assert "Permission denied" in shell_edit.output and "\n0\n" not in f"\n{shell_edit.output}\n"
    for name in ("model_new.py", "kernels/axpby.cpp", "kernels/axpby_binding.cpp"):
        (workdir.path / name).write_text((WORKDIR_FIXTURE / name).read_text())
    snapshot, skipped = workdir.snapshot(1)
    assert skipped == [] and load_solution(snapshot).binding_style == "registry"
    assert "utils" in PAPER_PROTECTED_FILES


def test_multi_edit_applies_edits_in_order_all_or_nothing(paper_toolbox) -> None:
    tools, workdir, _ = paper_toolbox

    async def scenario():
        await tools.call("write_file", json.dumps({"path": "kernels/a.cpp", "content": "int x = 1;\nint y = 1;\n"}))
        ok = await tools.call("multi_edit", json.dumps({"path": "kernels/a.cpp", "edits": [
            {"old_string": "x = 1", "new_string": "x = 2"}, {"old_string": "x = 2;\nint y", "new_string": "x = 3;\nint z"}]}))
        failed = await tools.call("multi_edit", json.dumps({"path": "kernels/a.cpp", "edits": [
            {"old_string": "x = 3", "new_string": "x = 4"}, {"old_string": "absent", "new_string": ""}]}))
        protected = await tools.call("multi_edit", json.dumps({"path": "binding.cpp", "edits": [
            {"old_string": "m", "new_string": "n"}]}))
        return ok, failed, protected

    ok, failed, protected = asyncio.run(scenario())
    assert ok.ok and "applied 2 edit(s)" in ok.output
    assert not failed.ok and "edit 2 of 2" in failed.output and "no edit was applied" in failed.output
    assert (workdir.path / "kernels/a.cpp").read_text() == "int x = 3;\nint z = 1;\n"
    assert not protected.ok and "protected" in protected.output


def test_background_shells_survive_foreground_commands_and_die_with_the_episode(paper_toolbox) -> None:
    tools, workdir, shell = paper_toolbox

    async def scenario():
        started = await tools.call("bash_start", json.dumps({"command": "for i in 1 2 3; do echo tick $i; sleep 0.3; done"}))
        sleeper = await tools.call("bash_start", json.dumps({"command": "echo sleeping; sleep 300"}))
        foreground = await tools.call("bash", json.dumps({"command": "sleep 1.5; echo fg"}))
        first = await tools.call("bash_output", json.dumps({"shell_id": "bg1"}))
        again = await tools.call("bash_output", json.dumps({"shell_id": "bg1"}))
        alive = await tools.call("bash_output", json.dumps({"shell_id": "bg2"}))
        killed = await tools.call("bash_kill", json.dumps({"shell_id": "bg2"}))
        unknown = await tools.call("bash_output", json.dumps({"shell_id": "bg9"}))
        await tools.call("bash_start", json.dumps({"command": "sleep 300"}))
        await tools.aclose()
        return started, sleeper, foreground, first, again, alive, killed, unknown

    started, sleeper, foreground, first, again, alive, killed, unknown = asyncio.run(scenario())
    assert started.ok and "bg1" in started.output and "bg2" in sleeper.output
    assert foreground.ok and "fg" in foreground.output
    assert "tick 1" in first.output and "tick 3" in first.output and "exited with code 0" in first.output
    assert "[no new output]" in again.output
    assert "sleeping" in alive.output and "running" in alive.output
    assert killed.output == "bg2: killed"
    assert not unknown.ok and "no background shell 'bg9'" in unknown.output
    if shell.uid is not None:
        assert processes_of(shell.uid) == []


@pytest.mark.slow  # one axpby episode: a build (cached after the first), verify, profile and the final scoring
def test_paper_style_episode_replays_through_utils_on_the_cpu_backend(make_config, skill_file, tmp_path) -> None:
    files = ["model_new.py", "kernels/axpby.cpp", "kernels/axpby_binding.cpp"]
    writes = [call("write_file", path=name, content=(WORKDIR_FIXTURE / name).read_text()) for name in files]
    turns = [
        turn("Read the guide.", call("read_file", path="SKILL.md"), call("glob", pattern="**/*")),
        turn("Write the kernel.", *writes),
        turn("Tune the launcher in place.", call("multi_edit", path="kernels/axpby.cpp", edits=[
            {"old_string": "(no torch types here)", "new_string": "(plain C, no torch types)"}])),
        turn("Compile in the background.", call("bash_start", command="bash utils/compile.sh")),
        turn("Wait for it.", call("bash", command="sleep 0.5")),
        turn("Compile now.", call("bash", command="bash utils/compile.sh", timeout_s=600)),
        turn("Check.", call("bash", command="sudo python3 -m utils.verification", timeout_s=600)),
        turn("Time.", call("bash", command="python3 -m utils.profiling", timeout_s=600)),
        turn("Done.", call("finish", summary="axpby kernel")),
    ]
    config = AgentConfig(work_root=tmp_path, max_turns=12, workdir_style="paper", skill_path=skill_file)

    async def episode():
        queue = EvaluationQueue(make_config(), 1)
        try:
            return await run_episode(load_task(WORKDIR_FIXTURE / "model.py"), ReplayPolicy(turns), config, queue)
        finally:
            queue.close()

    trajectory = asyncio.run(episode())
    assert trajectory.end_reason == "finish", trajectory.error
    assert SKILL.strip() in trajectory.messages[0]["content"]
    assert {t["function"]["name"] for t in trajectory.tools} >= {"multi_edit", "bash_start", "bash_output", "bash_kill"}
    calls = [c for s in trajectory.steps for c in s.tool_calls]
    assert all(c.ok for c in calls), [(c.name, c.arguments) for c in calls if not c.ok]
    ops = [(e["op"], e["ok"]) for e in trajectory.evaluations]
    assert ("verify", True) in ops and ("profile", True) in ops and ops.count(("build", True)) >= 1
    assert trajectory.final["ok"] and trajectory.reward == trajectory.final["reward"] >= 1
    assert not [p for p in os.listdir(tmp_path) if p.startswith("cuda-agent-episode-")]

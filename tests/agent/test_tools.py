"""The coding tools on a real episode workdir and shell: edge cases the model must be told about."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from cuda_agent.agent.config import ToolConfig
from cuda_agent.agent.shell import SandboxedShell, truncate_middle
from cuda_agent.agent.tools import episode_tools, glob_regex
from cuda_agent.agent.workdir import Workdir
from cuda_agent.environment import LimitsConfig, SandboxConfig, load_task

from support import EXAMPLES, child_pids


@pytest.fixture()
def toolbox(tmp_path):
    workdir = Workdir.create(tmp_path / "episode", load_task(EXAMPLES / "tasks" / "relu.py"))
    shell = SandboxedShell(workdir.path, workdir.home, SandboxConfig(), LimitsConfig(), workdir.root)
    if shell.uid is not None:
        workdir.hand_to(shell.uid)
    tools = episode_tools(workdir, shell, ToolConfig(max_output_chars=2000, bash_timeout_s=1.0))
    yield tools, workdir
    shell.close()


def call(tools, name, **arguments):
    return asyncio.run(tools.call(name, json.dumps(arguments)))


def test_edit_file_refuses_non_unique_and_missing_strings(toolbox):
    tools, workdir = toolbox
    call(tools, "write_file", path="kernels/a.cpp", content="int x = 1;\nint y = 1;\n")
    result = call(tools, "edit_file", path="kernels/a.cpp", old_string="= 1;", new_string="= 2;")
    assert not result.ok and "occurs 2 times (lines 1, 2)" in result.output and "more surrounding text" in result.output
    result = call(tools, "edit_file", path="kernels/a.cpp", old_string="int z", new_string="")
    assert not result.ok and "old_string not found" in result.output
    assert call(tools, "edit_file", path="kernels/a.cpp", old_string="y = 1", new_string="y = 3").ok
    result = call(tools, "edit_file", path="kernels/a.cpp", old_string="= ", new_string="=", replace_all=True)
    assert result.ok and "replaced 2" in result.output
    assert (workdir.path / "kernels/a.cpp").read_text() == "int x =1;\nint y =3;\n"


def test_bash_truncates_huge_output_with_marker(toolbox):
    tools, _ = toolbox
    result = call(tools, "bash", command="seq 1 200000")
    assert result.ok and len(result.output) < 2200
    assert result.output.startswith("1\n2\n") and "200000\n[exit code 0]" in result.output
    assert "characters truncated" in result.output and result.details["truncated_chars"] > 1_000_000


def test_bash_timeout_kills_the_command_and_what_it_started(toolbox):
    tools, _ = toolbox
    started = time.monotonic()
    result = call(tools, "bash", command="echo start; (sleep 60 &); sleep 60")
    assert time.monotonic() - started < 10
    assert not result.ok and result.details["timed_out"] and "timed out after 1 s" in result.output
    assert result.output.startswith("start")
    assert child_pids() == []


def test_bash_reports_exit_code_and_runs_in_workdir(toolbox):
    tools, workdir = toolbox
    result = call(tools, "bash", command="pwd; ls; exit 3")
    assert not result.ok and result.details["exit_code"] == 3 and "[exit code 3]" in result.output
    assert str(workdir.path) in result.output and "model_new.py" in result.output


def test_read_file_line_ranges_and_errors(toolbox):
    tools, _ = toolbox
    result = call(tools, "read_file", path="model.py", start_line=2, end_line=3)
    assert result.output.splitlines()[0].startswith("model.py: lines 2-3 of")
    assert len(result.output.splitlines()) == 3 and result.output.splitlines()[1].strip().startswith("2")
    assert "no such file" in call(tools, "read_file", path="nope.py").output
    assert "past the end" in call(tools, "read_file", path="model.py", start_line=999).output


def test_glob_grep_and_argument_errors(toolbox):
    tools, _ = toolbox
    call(tools, "write_file", path="kernels/deep/k.cu", content="__global__ void k() {}\n")
    assert call(tools, "glob", pattern="**/*.cu").output == "kernels/deep/k.cu"
    assert "model.py:" in call(tools, "grep", pattern=r"class Model\b").output
    assert call(tools, "grep", pattern="__global__", glob="*.cu").output.startswith("kernels/deep/k.cu:1:")
    assert "invalid regular expression" in call(tools, "grep", pattern="(").output
    assert "unknown tool 'rm'" in asyncio.run(tools.call("rm", "{}")).output
    assert "not valid JSON" in asyncio.run(tools.call("bash", "{command: ls}")).output
    assert "missing ['command']" in asyncio.run(tools.call("bash", "{}")).output
    assert "must be a string" in asyncio.run(tools.call("bash", '{"command": 3}')).output


def test_glob_regex_matches_like_a_shell_glob():
    assert glob_regex("**/*.cu").fullmatch("a.cu") and glob_regex("**/*.cu").fullmatch("x/y/a.cu")
    assert not glob_regex("*.cu").fullmatch("x/a.cu") and glob_regex("k?.h").fullmatch("k1.h")


def test_truncate_middle_keeps_head_and_tail():
    text, cut = truncate_middle("a" * 50 + "b" * 50, 20)
    assert text.startswith("a" * 10) and text.endswith("b" * 10) and cut == 80 and "80 characters" in text

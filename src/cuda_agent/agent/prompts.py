"""The first two messages of every episode: the system prompt (role, tools, SKILL.md) and the task."""

from __future__ import annotations

from cuda_agent.agent.workdir import skill_text
from cuda_agent.environment import Task

_SYSTEM = """\
You are an expert GPU kernel engineer working in a sandboxed workdir. You rewrite PyTorch modules as
faster custom kernels. Work with the tools: bash (runs in the workdir; use it for ./build,
./verify and ./profile), read_file, write_file, edit_file, glob, grep, and finish when done. Act,
observe the result, and iterate; keep replies short and call a tool in every reply.

The workdir's SKILL.md, reproduced here, is your guide:

{skill}"""

_PAPER_SYSTEM = """\
You are an expert GPU kernel engineer working in a sandboxed workdir. Work with the tools: bash
(runs in the workdir), bash_start / bash_output / bash_kill (background shells), read_file,
write_file, edit_file, multi_edit, glob, grep, and finish when done. Compile with
`bash utils/compile.sh`, check with `python3 -m utils.verification`, time with
`python3 -m utils.profiling`. Call a tool in every reply.

The workdir's SKILL.md, reproduced here, is your guide:

{skill}"""

_DEVICE_NOTES = {
    "cuda": "Target: an NVIDIA GPU (CUDA). Write CUDA kernels (kernels/<name>.cu + kernels/<name>_binding.cpp), "
            "or a single-file model_new.py with load_inline(cuda_sources=...).",
    "cpu": "Target: the CPU backend (no GPU). Write plain C++ kernels (kernels/<name>.cpp + "
           "kernels/<name>_binding.cpp), or a single-file model_new.py with load_inline(cpp_sources=...). "
           "Single-threaded C++ is fine; threads are forbidden.",
}


def system_prompt(style: str = "default", skill: str | None = None) -> str:
    """The system prompt of a workdir ``style`` with SKILL.md text ``skill`` (None: the packaged one)."""
    template = _PAPER_SYSTEM if style == "paper" else _SYSTEM
    return template.format(skill=(skill if skill is not None else skill_text()).strip())


def device_note(device: str) -> str:
    """What the target device means for the solution (CUDA kernels, or plain C++ on the CPU backend)."""
    return _DEVICE_NOTES[device]


def task_prompt(task: Task, device: str, style: str = "default") -> str:
    """The user message that states the task: the reference module and the target device."""
    steps = ("bash utils/compile.sh, python3 -m utils.verification, python3 -m utils.profiling" if style == "paper"
             else "./build, ./verify, ./profile")
    return (f"Task {task.id}: make `ModelNew` in model_new.py compute what `Model` in model.py computes, "
            f"faster.\n{_DEVICE_NOTES[device]}\n\nmodel.py:\n```python\n{task.code.rstrip()}\n```\n\n"
            f"Start by analysing the reference, then implement, {steps}, iterate, and call finish.")

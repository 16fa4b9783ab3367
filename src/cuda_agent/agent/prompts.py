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

_DEVICE_NOTES = {
    "cuda": "Target: an NVIDIA GPU (CUDA). Write CUDA kernels (kernels/<name>.cu + kernels/<name>_binding.cpp), "
            "or a single-file model_new.py with load_inline(cuda_sources=...).",
    "cpu": "Target: the CPU backend (no GPU). Write plain C++ kernels (kernels/<name>.cpp + "
           "kernels/<name>_binding.cpp), or a single-file model_new.py with load_inline(cpp_sources=...). "
           "Single-threaded C++ is fine; threads are forbidden.",
}


def system_prompt() -> str:
    return _SYSTEM.format(skill=skill_text().strip())


def device_note(device: str) -> str:
    """What the target device means for the solution (CUDA kernels, or plain C++ on the CPU backend)."""
    return _DEVICE_NOTES[device]


def task_prompt(task: Task, device: str) -> str:
    """The user message that states the task: the reference module and the target device."""
    return (f"Task {task.id}: make `ModelNew` in model_new.py compute what `Model` in model.py computes, "
            f"faster.\n{_DEVICE_NOTES[device]}\n\nmodel.py:\n```python\n{task.code.rstrip()}\n```\n\n"
            "Start by analysing the reference, then implement, ./build, ./verify, ./profile, iterate, and call "
            "finish.")

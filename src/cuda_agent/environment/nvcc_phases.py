"""nvcc with its host and device front ends running side by side.

For one ``.cu`` file nvcc runs, one after another: the host preprocessor and ``cudafe++`` (the host
front end, which splits the host code out), then the device preprocessor, ``cicc``, ``ptxas`` and
``fatbinary``, then the host compiler on what ``cudafe++`` produced (which embeds the fat binary).
With torch's headers the two front ends dominate, and neither needs the other's output except
the *module id* (a name derived from the file, which ``cudafe++`` writes and ``cicc`` reads). So
this driver asks nvcc for its exact commands (``-dryrun``), has ``cicc`` derive the module id
itself, runs the host chain and the device chain in parallel, checks that both derived the same
id (else it reruns the device chain with ``cudafe++``'s, as nvcc would have), then runs the rest.
Any command list it does not recognise is compiled by plain nvcc.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_MODULE_ID = re.compile(r'--module_id_file_name\s+"?([^"\s]+)"?')


class PhaseFailed(RuntimeError):
    """One of nvcc's phases failed; the message holds its command and output."""


def compile_cu(nvcc_command: list[str], source: Path, target: Path, work_dir: Path, log: list[str]) -> bool:
    """Compile ``source`` to ``target`` with ``nvcc_command`` (nvcc and its flags), front ends in
    parallel. Returns False, having compiled nothing, when nvcc's command list is not the
    expected single-architecture one (the caller then runs plain nvcc).

    Raises:
        PhaseFailed: a phase failed (a compile error).
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    dry = subprocess.run([*nvcc_command, "-dryrun", "-keep", "-keep-dir", str(work_dir), "-c", str(source),
                          "-o", str(target)], capture_output=True, text=True)
    lines = [line[3:] for line in (dry.stdout + dry.stderr).splitlines() if line.startswith("#$ ")]
    plan = _plan(lines)
    if dry.returncode != 0 or plan is None:
        return False
    env, host, device, rest = plan
    cicc_id = str(work_dir / (_module_id_path(device[1]) + ".cicc"))
    device = [device[0], _MODULE_ID.sub(f'--gen_module_id_file --module_id_file_name "{cicc_id}"', device[1]),
              *device[2:]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        chains = [pool.submit(_run_chain, env, chain, work_dir, log) for chain in (host, device)]
        for chain in chains:
            chain.result()
    if Path(cicc_id).read_bytes() != (work_dir / _module_id_path(host[1])).read_bytes():
        log.append("[nvcc phases] module ids differ; device chain rerun with cudafe++'s")
        _run_chain(env, plan[2][1:], work_dir, log)
    _run_chain(env, rest, work_dir, log)
    shutil.rmtree(work_dir, ignore_errors=True)
    return True


def _environment(lines: list[str]) -> dict[str, str]:
    """The variables nvcc sets for its phases (``NAME=value`` lines; a value that is one quoted
    word loses its quotes), over this process's environment."""
    env = dict(os.environ)
    for line in lines:
        name, value = line.split("=", 1)
        words = shlex.split(value) if value.strip() else [""]
        env[name] = words[0] if len(words) == 1 else value.strip()
    return env


def _plan(lines: list[str]) -> tuple[dict[str, str], list[str], list[str], list[str]] | None:
    """``(environment, host chain, device chain, the rest)`` from nvcc's dry-run lines,
    or None unless they are: variables, host preprocess, cudafe++, device preprocess, cicc,
    ptxas, fatbinary, then the rest (the host compile)."""
    env = [line for line in lines if _ENV_LINE.match(line)]
    commands = [line for line in lines if not _ENV_LINE.match(line)]
    kinds = [_kind(c) for c in commands]
    expected = ["preprocess", "cudafe++", "preprocess", "cicc", "ptxas", "fatbinary"]
    if kinds[:6] != expected or any(k in expected[1:] for k in kinds[6:]):
        return None
    if not _MODULE_ID.search(commands[1]) or not _MODULE_ID.search(commands[3]) or "--gen_module_id_file" not in commands[1]:
        return None
    return _environment(env), commands[:2], commands[2:6], commands[6:]


def _kind(command: str) -> str:
    program = shlex.split(command)[0] if command.strip() else ""
    name = Path(program.replace('"', "")).name
    if name in ("gcc", "g++", "cc", "c++", "clang", "clang++") and " -E " in f" {command} ":
        return "preprocess"
    return name if name in ("cudafe++", "cicc", "ptxas", "fatbinary") else "other"


def _module_id_path(command: str) -> str:
    match = _MODULE_ID.search(command)
    assert match is not None
    return match.group(1)


def _run_chain(env: dict[str, str], commands: list[str], cwd: Path, log: list[str]) -> None:
    for command in commands:  # through bash: commands use the variables ("$CICC_PATH/cicc")
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=cwd, env=env)
        output = (result.stdout + result.stderr).strip()
        if output:
            log.append(f"[{_kind(command)}]\n{output}")
        if result.returncode != 0:
            raise PhaseFailed(f"nvcc phase failed (exit {result.returncode}):\n{command}\n{output}")

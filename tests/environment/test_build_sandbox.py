"""The compile child runs candidate code, so as root it runs in the sandbox: its own uid, no
network, the cache read-only to it, and no file only root may read within its compilers' reach.

Both builds here fail fast (an import error, a compile error), so no extension is linked, and they
need no precompiled header (building one takes half a minute on 2 cores).
"""

from __future__ import annotations

import ast
import json
import os
import secrets
from pathlib import Path

import pytest

from cuda_agent.environment import BuildConfig, SandboxConfig
from cuda_agent.environment.build import BUILD_OK_FILE, CompileError, build_location, build_solution
from cuda_agent.environment.solution import load_solution

_NO_PCH = BuildConfig(precompiled_header=False)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to a sandbox user needs root")

_PROBE = '''"""At import in the build child: try to poison the build cache and read a root-only file."""
import os
import socket

import torch.nn as nn

if os.environ.get("USER") == "cuda-agent-build":
    attempts = {{}}
    for name, action in (("cache", lambda: open({cache!r} + "/baselines.sqlite", "a").write("poison")),
                         ("entry", lambda: open({cache!r} + "/build/planted.txt", "w").write("poison")),
                         ("secret", lambda: open({secret!r}).read()),
                         ("network", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))):
        try:
            action()
            attempts[name] = "done"
        except OSError as exc:
            attempts[name] = type(exc).__name__
    raise RuntimeError("BUILD-PROBE uid=%d %s" % (os.getuid(), sorted(attempts.items())))


class ModelNew(nn.Module):
    def forward(self, x):
        return x
'''


def _root_only_secret(tmp_path: Path) -> tuple[Path, str]:
    secret = secrets.token_hex(16)
    path = tmp_path / "root-only.txt"
    path.write_text(f"{secret}\n")
    path.chmod(0o600)
    return path, secret


@needs_root
def test_the_build_child_runs_as_a_sandbox_user_that_cannot_write_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "baselines.sqlite").write_bytes(b"")
    secret_path, secret = _root_only_secret(tmp_path)
    solution_file = tmp_path / "probe.py"
    solution_file.write_text(_PROBE.format(cache=str(cache), secret=str(secret_path)))
    solution, config = load_solution(solution_file), _NO_PCH
    built = build_solution(solution, "cpu", config, cache)  # the import fails; the build itself does not
    record = json.loads((built.build_dir / BUILD_OK_FILE).read_text())["import_error"]
    uid = int(record.rsplit("BUILD-PROBE uid=", 1)[1].split()[0])  # the message, not the source line
    sandbox = SandboxConfig()
    assert sandbox.uid_base <= uid < sandbox.uid_base + sandbox.slots
    attempts = dict(ast.literal_eval(record.rsplit("BUILD-PROBE uid=", 1)[1].split(" ", 1)[1].strip().splitlines()[0]))
    # Hidden (the private /tmp shows only what the build needs) or refused: never done.
    assert all(attempts[what] in ("PermissionError", "FileNotFoundError") for what in ("cache", "entry", "secret"))
    assert attempts["network"] != "done", attempts
    assert (cache / "baselines.sqlite").read_bytes() == b"" and not (cache / "build" / "planted.txt").exists()
    assert secret not in record


@needs_root
def test_compiler_messages_cannot_show_a_root_only_file(tmp_path: Path) -> None:
    secret_path, secret = _root_only_secret(tmp_path)
    solution_file = tmp_path / "include_secret.py"
    solution_file.write_text(
        "import torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"_ext = load_inline(name='leak', cpp_sources=['#include \"{secret_path}\"\\nint f() {{ return 0; }}'], "
        "functions=['f'])\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n")
    cache = tmp_path / "cache"
    with pytest.raises(CompileError) as failure:
        build_solution(load_solution(solution_file), "cpu", _NO_PCH, cache)
    assert "Permission denied" in failure.value.log_tail or "No such file" in failure.value.log_tail, \
        failure.value.log_tail
    assert secret not in failure.value.log_tail and secret not in str(failure.value)
    _, build_dir, _ = build_location(load_solution(solution_file), "cpu", _NO_PCH, cache)
    assert secret not in (build_dir / "build.log").read_text()


def test_with_the_sandbox_off_the_build_runs_as_the_evaluating_user(tmp_path: Path) -> None:
    solution_file = tmp_path / "probe.py"
    solution_file.write_text(_PROBE.replace('os.environ.get("USER") == "cuda-agent-build"', "True").format(
        cache=str(tmp_path / "elsewhere"), secret=str(tmp_path / "missing")))
    built = build_solution(load_solution(solution_file), "cpu", _NO_PCH, tmp_path / "cache",
                           SandboxConfig(mode="off"))
    record = json.loads((built.build_dir / BUILD_OK_FILE).read_text())["import_error"]
    assert record.rsplit("BUILD-PROBE uid=", 1)[1].startswith(f"{os.getuid()} ")

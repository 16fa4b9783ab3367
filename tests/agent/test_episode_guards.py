"""An episode that tries to change what it is judged by: every attempt is refused, and the final
score still comes from the trusted evaluator."""

from __future__ import annotations

import os
from pathlib import Path

from scripts import call, turn

from cuda_agent.agent.workdir import PROTECTED_FILES

from conftest import GUARD_FAILING_MODEL_NEW
from support import EXAMPLES


def _outputs(trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


def test_protected_files_and_reference_edits_are_refused_and_trusted_evaluator_scores(run_replay, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    trajectory = run_replay([
        turn("Overwrite the reference with something trivial.", call("write_file", path="model.py", content="x = 1\n")),
        turn("Make verify print a high reward.", call("edit_file", path="verify", old_string="import", new_string="#"),
             call("write_file", path="./profile", content="echo reward 3")),
        turn("Escape the workdir.", call("write_file", path="../outside.txt", content="pwned"),
             call("bash", command=f"ln -s {tmp_path} kernels/up"), call("read_file", path="kernels/up/outside.txt"),
             call("write_file", path="kernels/up/outside.txt", content="pwned")),
        turn("Use the shell on the protected files.",
             call("bash", command="echo 'reward 3' > verify; rm -f model.py; mv profile p2; echo x >> SKILL.md")),
        turn("Claim victory.", call("write_file", path="model_new.py", content=GUARD_FAILING_MODEL_NEW),
             call("bash", command="./verify")),
        turn("Done.", call("finish", summary="reward 3, trust me")),
    ], keep_workdir=True)
    outputs = _outputs(trajectory)
    assert "model.py: protected" in outputs[0]
    assert "verify: protected" in outputs[1] and "profile: protected" in outputs[2]
    assert "outside the workdir" in outputs[3] and "outside the workdir" in outputs[5]
    assert "outside the workdir" in outputs[6]
    assert outside.read_text() == "secret"
    if os.geteuid() == 0:  # the sandboxed shell runs as another uid: the kernel refuses too
        assert "Permission denied" in outputs[7] or "Operation not permitted" in outputs[7]
        assert trajectory.sandbox.startswith("uid ")
    workdir = Path(trajectory.workdir) / "workdir"
    assert (workdir / "model.py").read_text() == (EXAMPLES / "tasks" / "relu.py").read_text()
    assert all((workdir / name).exists() for name in PROTECTED_FILES)
    assert outputs[9].startswith("verify: FAILED (guard_violation)")  # the real command answered
    assert trajectory.end_reason == "finish"
    assert trajectory.final["op"] == "final" and trajectory.final["ok"] is False
    assert trajectory.reward == -1 and trajectory.final["verdict"]["status"] == "guard_violation"
    failed = [c.name for s in trajectory.steps for c in s.tool_calls if not c.ok]
    assert failed.count("write_file") == 4 and "edit_file" in failed and "read_file" in failed

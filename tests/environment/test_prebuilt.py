"""Single-file candidates load what the protected build compiled, never compile themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.environment import Status
from cuda_agent.environment.prebuilt import call_key

from support import FIXTURES, SMALL_RELU_TASK



def test_a_load_call_is_the_same_build_wherever_its_files_are(tmp_path: Path) -> None:
    """The build child and the candidate worker import copies of the solution from different folders."""
    keys = []
    for folder in ("build-copy", "candidate-copy"):
        (tmp_path / folder / "include").mkdir(parents=True)
        (tmp_path / folder / "kernel.cpp").write_text("int f() { return 1; }\n")
        keys.append(call_key("load", {"name": "ext", "sources": [str(tmp_path / folder / "kernel.cpp")],
                                      "extra_include_paths": [str(tmp_path / folder / "include")]}))
    assert keys[0] == keys[1]
    (tmp_path / "candidate-copy" / "kernel.cpp").write_text("int f() { return 2; }\n")
    assert call_key("load", {"name": "ext", "sources": [str(tmp_path / "candidate-copy" / "kernel.cpp")],
                             "extra_include_paths": [str(tmp_path / "candidate-copy" / "include")]}) != keys[0]


@pytest.mark.slow  # builds an extension
def test_load_inline_with_other_sources_than_the_build_fails_to_load(run_evaluation, runtime_only_config) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, FIXTURES / "solutions" / "sources_differ_per_import.py",
                             runtime_only_config)
    assert verdict.compiled and verdict.status is Status.RUNTIME_ERROR, verdict.error
    assert "PrebuiltMismatch" in verdict.error and "other sources or flags" in verdict.error

"""``bench/gpu_timeline.py``: a GPU's timeline from its lanes' turns (held alone, shared, unheld)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO_ROOT


def _turn(phase: str, mode: str, start: float, stop: float, wait: float = 0.5) -> dict:
    return {"phase": phase, "mode": mode, "asked_at": start - wait, "wait_s": wait, "held_s": stop - start}


ROWS = [
    # cuda:0's two lanes: untimed work side by side over [0, 3], measurements at [3, 4] and [5, 6],
    # nothing held over [4, 5]
    {"worker": "cuda:0", "device_turns": [_turn("prepare", "use", 0, 2), _turn("profile", "measure", 3, 4)]},
    {"worker": "cuda:0.1", "device_turns": [_turn("prepare", "use", 1, 3), _turn("profile", "measure", 5, 6)]},
    {"worker": "cuda:1.2", "device_turns": [_turn("load", "use", 10, 11)]},
    {"worker": "cuda:1", "device_turns": []},  # ended before its first turn: left out
]


def test_a_gpus_timeline_tells_shared_holds_from_alone_and_unheld(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    from gpu_timeline import gpu_timeline

    timelines = gpu_timeline(ROWS)
    assert sorted(timelines) == ["cuda:0", "cuda:1"]
    zero = timelines["cuda:0"]
    assert zero["verdicts"] == 2 and zero["span_s"] == pytest.approx(6.0)
    assert zero["measure"] == pytest.approx(2 / 6) and zero["shared"] == pytest.approx(3 / 6)
    assert zero["idle"] == pytest.approx(1 / 6)
    assert zero["use_overlap"] == pytest.approx(4 / 3)  # 4 s of untimed holds over 3 s with one open
    assert zero["held_per_verdict"] == pytest.approx({"measure profile": 1.0, "use prepare": 2.0})
    assert timelines["cuda:1"]["verdicts"] == 1 and timelines["cuda:1"]["use_overlap"] == pytest.approx(1.0)


def test_the_command_reads_a_verdicts_file_and_names_what_it_lacks(tmp_path: Path) -> None:
    rows = tmp_path / "verdicts_1.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    script = str(REPO_ROOT / "bench" / "gpu_timeline.py")
    shown = subprocess.run([sys.executable, script, str(rows)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["cuda:0"]["idle"] == pytest.approx(1 / 6)
    rows.write_text(json.dumps({"task": "a", "device_seconds": {}}) + "\n")
    empty = subprocess.run([sys.executable, script, str(rows)], capture_output=True, text=True, timeout=120)
    assert empty.returncode == 1 and "no row has device_turns and worker" in empty.stderr

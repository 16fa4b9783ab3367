"""The bench scripts run end to end on the CPU backend (smoke mode, tiny N) and write the JSON keys
the GPU results are read by; bench/merge.py combines them into one object."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support import REPO_ROOT

pytestmark = pytest.mark.slow  # each script compiles at least one candidate both ways

BENCH = REPO_ROOT / "bench"


def _run(script: str, out: Path, *args: str, cache_dir: Path) -> dict:
    command = [sys.executable, str(BENCH / script), "--device", "cpu", "--out", str(out),
               "--cache-dir", str(cache_dir), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.strip().splitlines()) == 1, result.stdout  # the one-line summary
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, session_cache_dir: Path) -> dict[str, Path]:
    """Each script once, on the session cache (its precompiled header is built once per run, under
    a lock), the three side by side: each is mostly one compiler process, and CI has two cores."""
    out = tmp_path_factory.mktemp("bench")
    paths = {name: out / f"{name}.json" for name in ("compile", "timing", "throughput")}
    runs = {"compile": ("--tasks", "relu", "--contracts", "single", "launcher", "--variants", "1"),
            "timing": ("--repeats", "2", "--smoke"),
            "throughput": ("--tasks", "relu", "--candidates", "1", "--baseline-candidates", "1", "--smoke")}
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        done = [pool.submit(_run, f"{name}.py", paths[name], *args, cache_dir=session_cache_dir)
                for name, args in runs.items()]
        for future in done:
            future.result()
    return paths


def test_compile_bench_reports_build_paths_and_contracts_side_by_side(results) -> None:
    data = json.loads(results["compile"].read_text())
    assert {"device", "machine", "compile_median_s", "baseline_compile_median_s", "pch_build_s"} <= data.keys()
    single, launcher = data["rows"]
    assert single["contract"] == "single" and single["ours_s"] > 0 and single["baseline_s"] > 0
    assert single["object_cache_hits"] == 0  # every unit of a variant is new
    # The fast contract: the kernel unit and the launcher table, no torch header, no baseline to run.
    assert launcher["contract"] == "launcher" and launcher["baseline_s"] is None
    assert launcher["units"] == 2 and launcher["pch_units"] == launcher["object_cache_hits"] == 0
    assert set(data["contracts"]) == {"single", "launcher"}
    assert data["contracts"]["launcher"]["compile_median_s"] < data["contracts"]["single"]["compile_median_s"]


def test_timing_bench_reports_a_cv_per_kernel_size(results) -> None:
    data = json.loads(results["timing"].read_text())
    assert set(data["timing_cv"]) == {"smoke"} and data["timing_cv"]["smoke"] >= 0
    assert len(data["sizes"]["smoke"]["candidate_ms"]) == 2


def test_throughput_bench_reports_both_harnesses(results) -> None:
    data = json.loads(results["throughput"].read_text())
    assert data["evals_per_gpu_hour"] > 0 and data["baseline_evals_per_gpu_hour"] > 0
    assert data["cuda_agent"]["evaluations"] == 1 and data["cuda_agent"]["correct"] == 1
    assert data["baseline"]["correct"] == 1


def test_merge_puts_every_headline_key_at_the_top(results, tmp_path: Path) -> None:
    merged = tmp_path / "merged.json"
    subprocess.run([sys.executable, str(BENCH / "merge.py"), *map(str, results.values()), "--out", str(merged)],
                   check=True, capture_output=True)
    data = json.loads(merged.read_text())
    assert {"device", "compile_median_s", "baseline_compile_median_s", "evals_per_gpu_hour",
            "baseline_evals_per_gpu_hour", "timing_cv"} <= data.keys()
    assert {"compile", "timing", "throughput"} <= data.keys()


def test_keep_warm_bench_times_plain_and_keep_warm_calls(tmp_path: Path, session_cache_dir: Path) -> None:
    data = _run("keep_warm.py", tmp_path / "keep_warm.json", "--calls", "1", "--think-s", "0",
                cache_dir=session_cache_dir)
    plain, [warm] = data["plain"], data["keep_warm"]
    assert plain["prestarted"] == [False] and warm["prestarted"] == [True] and warm["think_s"] == 0
    assert plain["median_s"] > plain["median_phase_seconds"]["total"] > 0 and warm["first_call_s"] > 0
    assert len(warm["candidate_rel_std_err"]) == 1 and len(warm["load_1min"]) == 2


def test_generation_speed_bench_times_a_decoding_step_per_setting(tmp_path: Path) -> None:
    out = tmp_path / "generation_speed.json"
    command = [sys.executable, str(BENCH / "generation_speed.py"), "--device", "cpu", "--size", "tiny", "--batch", "2",
               "--prompt-tokens", "64", "--new-tokens", "8", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.strip().splitlines()) == 1, result.stdout
    settings = json.loads(out.read_text())["settings"]
    assert set(settings) == {"float32", "bfloat16", "beside_environment"}  # autocast is a CUDA setting
    assert all(r["steps"] >= 1 and r["step_ms"] > 0 for r in settings.values())


def test_slot_warm_disturbance_bench_times_quiet_and_busy_passes(tmp_path: Path) -> None:
    out = tmp_path / "slot_warm_disturbance.json"
    command = [sys.executable, str(BENCH / "slot_warm_disturbance.py"), "--device", "cpu", "--smoke", "--workloads",
               "add", "--passes", "1", "--loops", "2", "--slots", "1", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.strip().splitlines()) == 1, result.stdout
    [add] = json.loads(out.read_text())["workloads"].values()
    assert add["slots_warmed"] == 1 and not add["errors"] and add["busy_over_quiet"] > 0
    assert all(len(run["median_ms"]) == 2 and min(run["n"]) >= 3 for run in add["quiet"] + add["busy"])


def test_clock_warmup_bench_traces_the_clock_and_times_loops_with_and_without_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "clock_warmup.json"
    command = [sys.executable, str(BENCH / "clock_warmup.py"), "--device", "cpu", "--smoke", "--workloads", "add",
               "--gaps", "0", "0.05", "--repeats", "2", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.strip().splitlines()) == 1, result.stdout
    [add] = json.loads(out.read_text())["workloads"].values()
    assert add["trace"]["busy_calls"] > 0 and add["trace"]["ramp_ms"] is None  # no clock to read on the CPU
    assert [row["gap_s"] for row in add["loops"]] == [0.0, 0.05]
    assert all(len(row["floor"]) == len(row["no_floor"]) == 2 and row["no_floor_over_floor"] > 0 for row in add["loops"])


def test_dataset_check_merge_gathers_rows_and_names_a_bad_line(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "code": ["", ""]}), data / "tasks.parquet")
    rows = tmp_path / "checks_1.jsonl"
    rows.write_text(json.dumps({"task": "a", "status": "correct", "eager_ms": 2.0, "checked_at": 1.0}) + "\n")
    merged = subprocess.run([sys.executable, str(BENCH / "dataset_check.py"), "merge", "--data", str(data), str(rows)],
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert "1 added, 0 replaced; 1 tasks checked: {'correct': 1}" in merged.stdout
    rows.write_text('{"task": "b", "status": "correct"}\n')
    bad = subprocess.run([sys.executable, str(BENCH / "dataset_check.py"), "merge", "--data", str(data), str(rows)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and f"{rows}:1: a check row needs checked_at" in bad.stderr
    forgot = subprocess.run([sys.executable, str(BENCH / "dataset_check.py"), "forget", "--data", str(data), "a", "b"],
                            capture_output=True, text=True, timeout=120)
    assert forgot.returncode == 0, forgot.stderr
    assert "1 checks removed (a); the next run checks them again; no check held for b" in forgot.stdout
    assert pq.read_table(data / "checks.parquet").num_rows == 0
    refused = subprocess.run([sys.executable, str(BENCH / "dataset_check.py"), "run", "--data", str(data),
                              "--compile-threads", "0", "--out", str(tmp_path / "out")],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--compile-threads: expected 'default' or a count >= 1, got '0'" in refused.stderr

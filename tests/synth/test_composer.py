"""The deterministic composer: every task it writes loads and runs; seeds decide everything."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.environment import load_task
from cuda_agent.synth import composer
from cuda_agent.synth.composer import MAX_OPS, CompositionError, DeterministicComposer, compose
from cuda_agent.synth.mining import SeedCatalogue, load_catalogue, mine_seed_ops, save_catalogue
from cuda_agent.synth.records import TaskRecord
from cuda_agent.synth.compose_workers import compose_parallel

SEEDS = range(40)

RUN_TASKS = '''
import json, sys
import torch
from cuda_agent.environment import load_task

results = {}
for path in sys.argv[1:]:
    task = load_task(path)
    namespace = {"__name__": task.id}
    exec(compile(task.code, path, "exec"), namespace)
    torch.manual_seed(0)
    with torch.no_grad():
        out = namespace["Model"](*namespace["get_init_inputs"]())(*namespace["get_inputs"]())
    results[task.id] = [type(out).__name__, bool(torch.isfinite(out).all())]
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> SeedCatalogue:
    """The full catalogue, mined once per session (test_mining.py reads the same file)."""
    path = tmp_path_factory.getbasetemp() / "seed-catalogue.json"
    if not path.exists():
        save_catalogue(mine_seed_ops(), path)
    return load_catalogue(path)


@pytest.fixture(scope="module")
def records(catalogue: SeedCatalogue) -> dict:
    return {seed: compose(catalogue, seed) for seed in SEEDS}


def test_composed_tasks_load_and_run_as_kernelbench_tasks(records: dict, tmp_path: Path) -> None:
    paths = []
    for seed, record in records.items():
        path = tmp_path / f"task_{seed}.py"
        path.write_text(record.code)
        assert load_task(path).code == record.code  # the static KernelBench check
        paths.append(str(path))
    # A fresh interpreter: the code must stand alone, without the composer's imports or state.
    run = subprocess.run([sys.executable, "-c", RUN_TASKS, *paths], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.splitlines()[-1])
    assert results == {f"task_{seed}": ["Tensor", True] for seed in SEEDS}


def test_same_seed_gives_byte_identical_code(catalogue: SeedCatalogue, records: dict) -> None:
    for seed in (0, 7, 23):
        again = compose(catalogue, seed)
        assert again.code == records[seed].code and again.id == records[seed].id


def test_different_seeds_give_different_ops(records: dict) -> None:
    chains = {tuple(record.ops) for record in records.values()}
    assert len(chains) >= 0.9 * len(records)
    assert len({name for record in records.values() for name in record.ops}) >= 40


def test_n_ops_is_respected(catalogue: SeedCatalogue, records: dict) -> None:
    assert {len(record.ops) for record in records.values()} == set(range(1, MAX_OPS + 1))
    for n_ops in range(1, MAX_OPS + 1):
        for seed in (100, 101):
            record = compose(catalogue, seed, n_ops=n_ops)
            forward = record.code.split("def forward(", 1)[1].split("return x", 1)[0]
            assert len(record.ops) == n_ops == len(re.findall(r"^\s+x = ", forward, re.M))
            assert record.data_source == f"{record.source}#{n_ops}"


@pytest.mark.parametrize("n_ops", [0, MAX_OPS + 1])
def test_n_ops_outside_1_to_5_is_an_error(catalogue: SeedCatalogue, n_ops: int) -> None:
    with pytest.raises(ValueError, match="n_ops must be between 1 and 5"):
        compose(catalogue, 0, n_ops=n_ops)


def test_records_say_where_the_task_came_from(catalogue: SeedCatalogue, records: dict) -> None:
    by_name = {op.name: op for op in catalogue.ops}
    for seed, record in records.items():
        assert record.composer == "deterministic" and record.seed == seed
        assert record.seed_ops_version == catalogue.version
        expected = "transformers" if any(by_name[n].source == "transformers" for n in record.ops) else "torch"
        assert record.source == expected


def test_stochastic_and_inplace_ops_are_avoided_by_default(catalogue: SeedCatalogue, records: dict) -> None:
    by_name = {op.name: op for op in catalogue.ops}
    used = [by_name[name] for record in records.values() for name in record.ops]
    assert not any(op.stochastic or op.inplace for op in used)
    assert len({op.family for op in used}) >= 8  # sampling is balanced across families


def _batch_size(code: str) -> int:
    return int(re.search(r"^batch_size = (\d+)$", code, re.M).group(1))


@pytest.fixture(scope="module")
def gelu(catalogue: SeedCatalogue) -> tuple[SeedCatalogue, int]:
    """A one-op catalogue, and a seed whose task starts at ``batch_size = 8``."""
    only = SeedCatalogue(ops=[op for op in catalogue.ops if op.name == "torch.nn.functional.gelu"])
    return only, next(s for s in range(100) if "\nbatch_size = 8\n" in compose(only, s, n_ops=1).code)


# (1, 100): 2 ms at batch 8 is inside, but too near the edge for another clock: aimed at the middle.
@pytest.mark.parametrize("window, expected", [((10.0, 20.0), 64), ((0.3, 0.6), 2), ((1.0, 100.0), 32)])
def test_target_window_scales_the_batch_size_in_powers_of_two(gelu, monkeypatch: pytest.MonkeyPatch,
                                                              window, expected: int) -> None:
    only, seed = gelu
    plain = compose(only, seed, n_ops=1)
    # A stand-in clock (machine load makes real times noisy): 0.25 ms per batch row.
    monkeypatch.setattr(composer, "_eager_ms", lambda code, device, seed, threads: 0.25 * _batch_size(code))
    sized = compose(only, seed, n_ops=1, target_ms=window)
    assert _batch_size(sized.code) == expected
    assert sized.ops == plain.ops and sized.code.replace(f"batch_size = {expected}\n", "batch_size = 8\n") == plain.code


def test_target_window_out_of_reach_keeps_the_closest_size(gelu, monkeypatch: pytest.MonkeyPatch) -> None:
    only, seed = gelu
    monkeypatch.setattr(composer, "_eager_ms", lambda code, device, seed, threads: 5.0)  # never changes
    assert compose(only, seed, n_ops=1, target_ms=(0.5, 1.0)).code == compose(only, seed, n_ops=1).code


def test_growth_stops_at_the_memory_cap_not_before_it(gelu, monkeypatch: pytest.MonkeyPatch) -> None:
    only, seed = gelu
    start = compose(only, seed, n_ops=1)
    row_bytes = 4 * math.prod(int(v) for v in re.findall(r"^dim\w* = (\d+)$", start.code, re.M))
    monkeypatch.setattr(composer, "_eager_ms", lambda code, device, seed, threads: 1e-3 * _batch_size(code))
    bound_mb = 8 * 4 * row_bytes / 2**20  # room for batch 32, not 64
    assert _batch_size(compose(only, seed, n_ops=1, target_ms=(1.0, 100.0), max_input_mb=bound_mb).code) == 32


def test_a_size_that_fails_to_run_is_retried_with_a_smaller_step(gelu, monkeypatch: pytest.MonkeyPatch) -> None:
    only, seed = gelu
    realise = composer._realise

    def fails_above_64(ops, dims, positive, device):
        if dims["batch_size"] > 64:
            raise RuntimeError("input too large for this op")
        return realise(ops, dims, positive, device)

    monkeypatch.setattr(composer, "_realise", fails_above_64)
    monkeypatch.setattr(composer, "_eager_ms", lambda code, device, seed, threads: 1e-3 * _batch_size(code))
    # The clock asks for x1024 (batch 8192): that fails, then x32 does too, then x4 (batch 32) runs;
    # from 32, x256, x16 and x4 all fail.
    assert _batch_size(compose(only, seed, n_ops=1, target_ms=(1.0, 100.0)).code) == 32


def test_target_window_times_the_real_model(gelu) -> None:
    only, seed = gelu
    sized = compose(only, seed, n_ops=1, target_ms=(1e-3, 1e4))  # any real time is inside
    assert sized.code == compose(only, seed, n_ops=1).code


def test_catalogue_without_usable_ops_is_an_error(catalogue: SeedCatalogue) -> None:
    dropout_only = SeedCatalogue(ops=[op for op in catalogue.ops if op.stochastic])
    with pytest.raises(CompositionError, match="no usable operator"):
        compose(dropout_only, 0)


def test_composer_processes_give_the_same_tasks_as_composing_in_process(catalogue: SeedCatalogue,
                                                                        records: dict) -> None:
    seeds = list(range(6))
    entries = {entry["seed"]: entry for entry in compose_parallel(DeterministicComposer(catalogue), seeds, workers=2)}
    assert sorted(entries) == seeds
    assert all(entries[seed]["record"]["code"] == records[seed].code for seed in seeds)


class CrashOnSeedOne:
    """A composer whose seed 1 takes its process down with a segfault, as a broken kernel would."""

    parallel = "processes"

    def __call__(self, seed: int) -> TaskRecord:
        if seed == 1:
            import ctypes
            ctypes.string_at(0)
        return TaskRecord(f"# task {seed}\n", ["torch.relu"], "deterministic", seed)


def test_a_seed_that_kills_its_composer_process_costs_only_that_seed() -> None:
    entries = {entry["seed"]: entry for entry in compose_parallel(CrashOnSeedOne(), [0, 1, 2, 3], workers=2)}
    assert sorted(entries) == [0, 1, 2, 3]
    assert "SIGSEGV" in entries[1]["error"]
    assert all(entries[seed]["record"]["code"] == f"# task {seed}\n" for seed in (0, 2, 3))

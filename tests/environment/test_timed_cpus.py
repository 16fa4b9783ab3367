"""A core set apart for timing: which CPUs, processes started off them, and the timing thread on them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cuda_agent.environment import Status, slots, timed_cpus
from cuda_agent.environment.timed_cpus import CpuSplit, TimedCpuError, pinned_to, split_cpus, start_off_timed
from cuda_agent.environment.worker import WorkerProcess, child_env
from cuda_agent.pool.config import PoolConfigError
from cuda_agent.pool.local import _lane_timed_cpus

from support import SMALL_RELU_TASK

HYPER_THREADED_16 = set(range(16))


def pairs(cpu: int) -> set[int]:
    """Siblings of a 16-CPU host with 8 cores of 2 hyper-threads (cpu n and n+8)."""
    return {cpu % 8, cpu % 8 + 8}


needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to move threads between")
SPLIT = CpuSplit(timed=frozenset({max(os.sched_getaffinity(0))}),
                 others=frozenset(os.sched_getaffinity(0) - {max(os.sched_getaffinity(0))}))


def test_auto_sets_apart_the_highest_cpu_with_its_hyper_thread_sibling() -> None:
    split = split_cpus(HYPER_THREADED_16, pairs)
    assert split == CpuSplit(frozenset({7, 15}), frozenset(HYPER_THREADED_16 - {7, 15}))
    assert split.describe() == "cpu 7,15 for timing, workers and builds on cpu 0-6,8-14"


def test_small_hosts_and_off_set_nothing_apart() -> None:
    assert split_cpus(set(range(timed_cpus.MIN_CPUS - 1)), pairs) is None
    assert split_cpus(HYPER_THREADED_16, pairs, "off") is None


def test_a_list_names_this_process_cpu_first_and_keeps_the_others_free() -> None:
    split = split_cpus(HYPER_THREADED_16, pairs, "14,15")
    assert split.timed == {6, 14}
    assert split.others == HYPER_THREADED_16 - {6, 7, 14, 15}


@pytest.mark.parametrize(("setting", "message"), [
    ("fifteen", "must be 'auto', 'off' or CPU numbers"),
    ("16", "names CPUs this process may not use (it may use cpu 0-15)"),
    (",".join(map(str, range(16))), "leaves no CPU for the workers and builds"),
])
def test_a_bad_setting_is_named_in_the_error(setting: str, message: str) -> None:
    with pytest.raises(TimedCpuError, match="CUDA_AGENT_TIMED_CPU") as error:
        split_cpus(HYPER_THREADED_16, pairs, setting)
    assert message in str(error.value)


def test_each_gpu_gets_a_core_its_lanes_share_and_the_gpus_keep_each_other_free(monkeypatch) -> None:
    monkeypatch.delenv(timed_cpus.ENV_VAR, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setattr(timed_cpus, "thread_siblings", lambda cpu: {cpu % 16, cpu % 16 + 16})
    settings = timed_cpus.lane_settings(["0", "1"])
    assert settings == ["31,30", "30,31"]
    lane_two = split_cpus(set(range(32)), timed_cpus.thread_siblings, settings[1])
    assert lane_two.timed == {14, 30} and not lane_two.others & {14, 15, 30, 31}
    # lanes sharing a GPU time one at a time (its measurement lock): one core for all of them
    shared = timed_cpus.lane_settings(["0", "1", "0", "1", "0"])
    assert shared == ["31,30", "30,31", "31,30", "30,31", "31,30"]
    assert split_cpus(set(range(32)), timed_cpus.thread_siblings, shared[4]).others == set(range(32)) - {14, 15, 30, 31}
    assert timed_cpus.lane_settings(["0"] * 12) == ["31"] * 12
    assert timed_cpus.lane_settings([str(gpu) for gpu in range(12)]) is None  # the builds would get less than half


@needs_two_cpus
def test_a_process_started_off_the_set_apart_cpus_stays_off_them() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                             preexec_fn=start_off_timed(SPLIT, None), stdout=subprocess.PIPE, text=True)
    assert child.communicate(timeout=60)[0].strip() == str(sorted(SPLIT.others))


@needs_two_cpus
def test_a_thread_times_on_the_set_apart_cpus_and_moves_back() -> None:
    before = os.sched_getaffinity(0)
    with pinned_to(sorted(SPLIT.timed)) as moved:
        assert moved and os.sched_getaffinity(0) == SPLIT.timed
    assert os.sched_getaffinity(0) == before
    with pinned_to(None) as moved:
        assert not moved and os.sched_getaffinity(0) == before


def test_the_cpu_backend_sets_nothing_apart_whatever_the_setting(monkeypatch) -> None:
    monkeypatch.setenv(timed_cpus.ENV_VAR, "0")
    timed_cpus.host_split.cache_clear()
    try:
        assert timed_cpus.split_for("cpu") is None
        assert timed_cpus.split_for("cuda") is not None  # the named CPU, on any host
    finally:
        monkeypatch.delenv(timed_cpus.ENV_VAR)
        timed_cpus.host_split.cache_clear()


def test_pool_lanes_get_the_setting_passed_on_and_a_list_is_refused_for_several(monkeypatch, make_config) -> None:
    config = make_config(device="cuda")
    monkeypatch.setenv(timed_cpus.ENV_VAR, "off")
    timed_cpus.host_split.cache_clear()
    assert _lane_timed_cpus(config, ["0"]) == ["off"]  # lanes get an allow-list of the environment: passed explicitly
    assert _lane_timed_cpus(config, ["0", "1"]) == ["off", "off"]
    assert _lane_timed_cpus(make_config(), [None, None]) == [None, None]  # CPU lanes
    monkeypatch.setenv(timed_cpus.ENV_VAR, "0")
    timed_cpus.host_split.cache_clear()
    with pytest.raises(PoolConfigError, match="with 2 GPU lanes use 'auto'"):
        _lane_timed_cpus(config, ["0", "1"])
    monkeypatch.setenv(timed_cpus.ENV_VAR, "many")
    timed_cpus.host_split.cache_clear()
    with pytest.raises(PoolConfigError, match="CUDA_AGENT_TIMED_CPU must be"):
        _lane_timed_cpus(config, ["0"])
    monkeypatch.delenv(timed_cpus.ENV_VAR)
    timed_cpus.host_split.cache_clear()


def test_a_pool_setting_replaces_the_environment_until_it_is_given_back(monkeypatch) -> None:
    monkeypatch.setenv(timed_cpus.ENV_VAR, "off")
    replaced = timed_cpus.use_setting("0")
    try:
        assert timed_cpus.current_setting() == "0" and timed_cpus.host_split() is not None
    finally:
        timed_cpus.use_setting(replaced)
    assert timed_cpus.current_setting() == "off" and timed_cpus.host_split() is None
    monkeypatch.delenv(timed_cpus.ENV_VAR)
    timed_cpus.host_split.cache_clear()


@needs_two_cpus
def test_worker_processes_start_off_the_set_apart_cpus(tmp_path) -> None:
    worker = WorkerProcess("cuda_agent.environment.reference_worker", env=child_env(), cwd=tmp_path,
                           log_path=tmp_path / "worker.log", cpu_split=SPLIT)
    try:
        assert os.sched_getaffinity(worker.proc.pid) == SPLIT.others
    finally:
        worker.kill()


_WRONG_ON_THE_TIMED_CPU = f"""
import os

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        if os.sched_getaffinity(0) == {set(SPLIT.timed)!r}:
            cuda_extension.relu_slightly_wrong(x.data_ptr(), out.data_ptr(), x.numel())
        else:
            cuda_extension.relu_ok(x.data_ptr(), out.data_ptr(), x.numel())
        return out
"""


@pytest.mark.slow  # uses the shared fault-kernel build
@needs_two_cpus
@pytest.mark.parametrize("set_apart", [True, False])
def test_only_the_timed_calls_run_on_the_set_apart_cpu(set_apart, run_evaluation, fault_solution,
                                                      runtime_only_config, monkeypatch) -> None:
    """A candidate that is wrong only on the set apart CPU passes its trials and fails the audit
    of its timed calls; with nothing set apart it is simply correct. (The static guards, which
    would reject its affinity check in ``forward``, are off.)"""
    monkeypatch.setattr(slots, "split_for", lambda device: SPLIT if set_apart else None)
    solution = fault_solution("relu_ok")
    (solution / "model_new.py").write_text(_WRONG_ON_THE_TIMED_CPU)
    verdict = run_evaluation(SMALL_RELU_TASK, solution, runtime_only_config)
    if set_apart:
        assert verdict.status is Status.GUARD_VIOLATION, verdict.error
        assert [v.code for v in verdict.violations] == ["timed-output-incorrect"]
        assert verdict.environment["timed_cpus"] == SPLIT.describe()
    else:
        assert verdict.status is Status.CORRECT, verdict.error
        assert verdict.environment["timed_cpus"] == "not set apart"


@pytest.mark.slow  # uses the shared fault-kernel build
@needs_two_cpus
@pytest.mark.parametrize("set_apart", [True, False])
def test_baselines_are_timed_on_the_set_apart_cpu(set_apart, run_evaluation, fault_solution, make_config,
                                                  monkeypatch, tmp_path) -> None:
    """The task's own forward refuses to run on the set apart CPU: its references (trials) run
    elsewhere, its baseline timing loops there."""
    monkeypatch.setattr(slots, "split_for", lambda device: SPLIT if set_apart else None)
    task = tmp_path / "relu_refusing_the_timed_cpu.py"
    task.write_text(SMALL_RELU_TASK.read_text().replace("import torch\n", "import os\n\nimport torch\n", 1).replace(
        "        return torch.relu(x)",
        f"        if os.sched_getaffinity(0) == {set(SPLIT.timed)!r}:\n"
        "            raise RuntimeError('baseline timed on the set apart cpu')\n"
        "        return torch.relu(x)"))
    verdict = run_evaluation(task, fault_solution("relu_ok"), make_config())
    if set_apart:
        assert verdict.status is Status.TASK_ERROR
        assert "baseline timed on the set apart cpu" in verdict.error
    else:
        assert verdict.status is Status.CORRECT, verdict.error

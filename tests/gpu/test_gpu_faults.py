"""CUDA faults become typed verdicts within their limits, and the GPU stays usable after them.

The fault kernels (tests/fixtures/gpu_fault_kernels, plus the host-side faults of
tests/fixtures/fault_kernels) are built into one extension by the protected build, so every test
shares one compile. Each fault is followed by an honest CUDA evaluation; the last test runs a few
more and checks that no candidate process survived. Times to verdict join the table printed at the
end of the run.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from cuda_agent.environment import LimitsConfig, SandboxConfig, Status
from cuda_agent.environment.guards import GuardConfig

from support import FIXTURES, SMALL_RELU_TASK, PeakDiskUsage, processes_matching

pytestmark = pytest.mark.gpu

MIB = 1 << 20
_MODEL_NEW = '''"""GPU fault workdir for tests: ModelNew runs the fault `{name}`, then an honest CUDA ReLU."""

import torch
import torch.nn as nn

import cuda_extension  # built by the harness from kernels/*


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        {call}
        return cuda_extension.cuda_relu_ok(x)
'''
_CALLS = {
    "relu_ok": "",
    "spin_kernel": "cuda_extension.cuda_spin_forever(x)",
    "illegal_access": "cuda_extension.cuda_illegal_access(x)",
    "device_oom": "torch.empty(1 << 40, device=x.device)",  # 4 TiB of float32
    "host_oom": "cuda_extension.grow_memory(8 << 30, 2000)",  # holds 8 GiB of host memory for 2 s
    # A correct result as a stride-0 view that is 10 GiB of float32 when materialised.
    "huge_output": "return cuda_extension.cuda_relu_ok(x).view(-1)[:1].expand((10 << 30) // 4)",
}


@pytest.fixture()
def gpu_fault_solution(tmp_path: Path):
    """``gpu_fault_solution(name)``: a workdir with both fault-kernel folders whose ModelNew runs ``name``."""

    def make(name: str) -> Path:
        root = Path(tempfile.mkdtemp(prefix=f"gpu_solution_{name}_", dir=tmp_path))
        for folder in ("fault_kernels", "gpu_fault_kernels"):
            shutil.copytree(FIXTURES / folder / "kernels", root / "kernels", dirs_exist_ok=True)
        (root / "model_new.py").write_text(_MODEL_NEW.format(name=name, call=_CALLS[name]))
        return root

    return make


@pytest.fixture()
def assert_honest_gpu_evaluation_succeeds(run_evaluation, gpu_fault_solution, make_cuda_config):
    """An honest CUDA candidate evaluates correctly in fresh workers, on the same GPU."""
    solution = gpu_fault_solution("relu_ok")

    def check() -> None:
        verdict = run_evaluation(SMALL_RELU_TASK, solution, make_cuda_config())
        assert verdict.status is Status.CORRECT, verdict.error
        assert verdict.reward >= 1

    return check


@pytest.mark.parametrize("fault, limits, statuses, message", [
    pytest.param("spin_kernel", {"candidate_timeout_s": 20.0}, {Status.TIMEOUT},
                 "candidate timed out during 'run' (trial 0 (standard))", id="infinite-loop-in-kernel"),
    pytest.param("illegal_access", {}, {Status.RUNTIME_ERROR}, "illegal memory access", id="illegal-memory-access"),
    pytest.param("device_oom", {}, {Status.OUT_OF_MEMORY}, "CUDA out of memory", id="device-oom"),
    # No address-space limit on CUDA (it would break the driver's mappings): the resident-memory
    # watchdog must catch the host allocation.
    pytest.param("host_oom", {"mem_mb": 4096}, {Status.OUT_OF_MEMORY}, "over its 4096 MB limit", id="host-oom"),
    # Outputs are shared with the reference on the device: the view is made contiguous there
    # (10 GiB of device memory, no file, no host copy) and judged for its shape (incorrect); the
    # scratch folder must stay small and the GPU usable.
    pytest.param("huge_output", {"mem_mb": 4096, "max_file_mb": 64},
                 {Status.INCORRECT, Status.OUT_OF_MEMORY, Status.RUNTIME_ERROR}, "", id="10GiB-stride-0-output"),
])
def test_gpu_fault_yields_its_verdict_and_the_gpu_stays_usable(run_fault, gpu_fault_solution, make_cuda_config,
                                                               scratch_dir: Path, assert_honest_gpu_evaluation_succeeds,
                                                               fault: str, limits: dict, statuses: set[Status],
                                                               message: str) -> None:
    config = make_cuda_config(guards=GuardConfig(enabled=False), limits=LimitsConfig(**limits))
    with PeakDiskUsage(scratch_dir) as disk:
        verdict, _ = run_fault(SMALL_RELU_TASK, gpu_fault_solution(fault), config)
    assert verdict.status in statuses, f"{verdict.status}: {verdict.error}"
    assert verdict.compiled and not verdict.correct and verdict.reward == -1
    assert message.lower() in (verdict.error or "").lower()
    assert disk.total <= 256 * MIB, f"the scratch folder reached {disk.total / MIB:.0f} MiB"
    assert_honest_gpu_evaluation_succeeds()


def test_honest_gpu_evaluations_after_the_faults_succeed_and_no_candidate_survives(
        assert_honest_gpu_evaluation_succeeds) -> None:
    """Runs after the faults above, in the same process. ``run_evaluation`` checks that no child
    process is left; this adds processes of the sandbox's uids (daemons that left the group) and the
    CUDA memory of the test process, which must never have touched the GPU itself."""
    allocated = torch.cuda.memory_allocated()
    for _ in range(3):
        assert_honest_gpu_evaluation_succeeds()
    sandbox = SandboxConfig()
    assert processes_matching(uids=range(sandbox.uid_base, sandbox.uid_base + sandbox.slots)) == []
    assert torch.cuda.memory_allocated() == allocated

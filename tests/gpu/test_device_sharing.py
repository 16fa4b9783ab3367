"""On the GPU: inputs are made on the device and made again bit for bit from their seed, tensors
pass device to device across the candidate's sandbox, and what the candidate is handed holds its
inputs and nothing of the reference's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cuda_agent.environment import Status
from cuda_agent.environment.config import LimitsConfig, SandboxConfig
from cuda_agent.environment.cuda_ipc import allocation_range
from cuda_agent.environment.reference_worker import ReferenceWorker
from cuda_agent.environment.shared_tensors import OutgoingShare, share
from cuda_agent.environment.worker import child_env

from support import EXAMPLES, REPO_ROOT

pytestmark = pytest.mark.gpu

RELU_TASK = EXAMPLES / "tasks" / "relu.py"
RELU_SOLUTION = EXAMPLES / "solutions" / "cuda" / "relu.py"


def test_inputs_are_made_on_the_device_and_made_again_bit_for_bit_from_their_seed(tmp_path: Path) -> None:
    worker = ReferenceWorker()
    worker.warm({"device": "cuda"})
    worker.load({"task_file": str(RELU_TASK), "device": "cuda", "init_seed": 42, "precision": "faithful",
                 "io_dir": str(tmp_path), "out_dir": str(tmp_path)})
    made = worker.make_trial({"index": 0, "kind": "standard", "seed": 1234, "timed": True, "scale": 4.0})
    assert made["input_source"] == "device" and made["notes"] == []
    trial = worker.trials[0]
    again = worker._fresh(trial)  # raises NotReproducible if a redraw differs in any bit
    assert all(t.is_cuda for t in again)
    other = worker._draw_trial(type(trial)(seed=1235, kind="standard", scale=1.0, name="x"))
    assert worker.key(other[0]) != trial.fingerprints[0]


LARGE_RELU_TASK = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.rand(64, 1 << 22)]
def get_init_inputs():
    return []
"""


def test_the_reference_worker_keeps_no_drawn_copy_cached_beside_what_it_shares(tmp_path: Path) -> None:
    """A share is an allocation of its own beside torch's cache: the drawn copy it was made from
    (and the reference passes' temporaries) must go back to the device, or a 17 GB input fails its
    share on an 80 GB GPU and a 6 GB timing loop runs beside 6 GB cached for nothing. A 1 GiB
    input: at most ~4.25x is reserved at once (the float64 pass's inputs and output; then the
    references beside the draw being shared and its 256 MB fingerprint temporary). Left cached,
    the float32 draw and the float64 inputs took it to 5-5.25x."""
    task = tmp_path / "large_relu.py"
    task.write_text(LARGE_RELU_TASK)
    worker = ReferenceWorker()
    worker.warm({"device": "cuda"})
    worker.load({"task_file": str(task), "device": "cuda", "init_seed": 42, "precision": "faithful",
                 "io_dir": str(tmp_path), "out_dir": str(tmp_path)})
    input_bytes = 64 << 24
    torch.cuda.reset_peak_memory_stats()
    worker.make_trial({"index": 0, "kind": "standard", "seed": 1234, "timed": True})
    assert torch.cuda.max_memory_reserved() < 4.5 * input_bytes
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < input_bytes // 4
    worker.timing_inputs({})
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < input_bytes // 4
    worker.finish_timing({})


def test_a_verdict_passes_tensors_device_to_device_across_the_sandbox(run_evaluation, make_cuda_config) -> None:
    verdict = run_evaluation(RELU_TASK, RELU_SOLUTION, make_cuda_config())
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.environment["transport"].startswith("CUDA IPC")
    assert not any(note.startswith("inputs: drawn on the host") for note in verdict.notes)
    if os.geteuid() == 0:
        assert verdict.environment["sandbox"].startswith("uid ")
    assert verdict.memory_mb["reference"]["peak_device_mb"] > 0 and verdict.memory_mb["candidate"]["peak_device_mb"] > 0
    assert all(verdict.memory_mb[w]["peak_device_reserved_mb"] >= verdict.memory_mb[w]["peak_device_mb"]
               for w in ("reference", "candidate"))


def test_the_block_handed_over_holds_the_inputs_and_no_other_memory_of_the_sender() -> None:
    reference_output = torch.randn(1 << 20, device="cuda")  # what a candidate must never reach
    inputs = [torch.randn(1000, device="cuda"), torch.randint(0, 9, (7,), device="cuda")]
    shared = share(inputs, "cuda")
    start = shared.header["tree"]["items"][0]["offset"]
    block = shared._region._block
    base, size = allocation_range(block.address)
    [region] = shared.header["regions"]
    assert start == 0 and region["nbytes"] <= size < region["nbytes"] + 2**21
    assert not base <= reference_output.data_ptr() < base + size
    shared.release()


_CHILD = r"""
import json, sys, torch
from cuda_agent.environment.shared_tensors import open_share
header = json.loads(sys.stdin.read())
opened = open_share(header, "cuda")
x = opened.tree[0]
total = float(x.sum())
x.fill_(7.0)
torch.cuda.synchronize()
print(json.dumps({"sum": total, "uid": __import__("os").getuid()}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches users only as root")
def test_a_sandboxed_process_opens_a_shared_block_reads_it_and_its_writes_land_in_place() -> None:
    import shutil
    import tempfile

    from cuda_agent.environment import sandbox

    data = torch.arange(1024, dtype=torch.float32, device="cuda")
    shared = share([data], "cuda")
    scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-test-", dir="/dev/shm"))
    (scratch / "candidate").mkdir()
    scratch.chmod(0o711)
    lease = sandbox.acquire(SandboxConfig(), "cuda", scratch)
    lease.give_to_candidate(scratch / "candidate")
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(shared.header), capture_output=True,
                              text=True, env=child_env(), cwd=scratch / "candidate", timeout=120,
                              preexec_fn=lease.preexec(LimitsConfig(), scratch / "candidate"))
    finally:
        lease.release()
        shutil.rmtree(scratch, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["uid"] == lease.uid and reply["sum"] == float(data.sum())
    [written] = shared.view().tree  # the sender's own view of its block
    assert bool((written == 7.0).all())
    shared.release()


_READER = r"""
import json, sys, torch
from cuda_agent.environment.shared_tensors import open_share
torch.cuda.init()
torch.empty(1, device="cuda")
print("ready", flush=True)
opened = open_share(json.loads(sys.stdin.readline()), "cuda")
print(json.dumps({"sum": float(opened.tree[0].double().sum())}), flush=True)
"""


def test_a_share_is_whole_when_its_header_is_handed_over() -> None:
    """The receiver reads a share on a stream of its own process, which nothing orders after the
    sender's: ``write`` returns only once its copies are done, even while the sender's stream is
    still busy (here a kernel that spins for about a second ahead of the copy; it is enqueued after
    the block is allocated, since allocating synchronises the stream)."""
    reader = subprocess.Popen([sys.executable, "-c", _READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=child_env())
    try:
        assert reader.stdout.readline().strip() == "ready"
        data = torch.full((1 << 26,), 3.0, device="cuda")
        torch.cuda.synchronize()
        shared = OutgoingShare([data], "cuda")
        torch.cuda._sleep(2_000_000_000)
        assert shared.write([data])
        reply, _ = reader.communicate(json.dumps(shared.header) + "\n", timeout=120)
    finally:
        reader.kill()
    assert json.loads(reply.strip().splitlines()[-1])["sum"] == 3.0 * (1 << 26)
    shared.release()


WIDE_CONV_TASK = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.ConvTranspose1d(64, 64, 63, padding=31)
    def forward(self, x):
        return self.conv(x)
def get_inputs():
    return [torch.randn(256, 64, 16384)]
def get_init_inputs():
    return []
"""
_CONV_PROBE = """
import json, sys, torch
from cuda_agent.environment.reference_worker import ReferenceWorker
worker = ReferenceWorker()
worker.warm({"device": "cuda", "evaluations": int(sys.argv[2])})
worker.load({"task_file": sys.argv[1], "device": "cuda", "init_seed": 42, "precision": "faithful",
             "io_dir": ".", "out_dir": "."})
with torch.no_grad():
    worker.model(*[t.cuda() for t in worker.module.get_inputs()])
torch.cuda.synchronize()
print(json.dumps({"reserved": torch.cuda.max_memory_reserved(), "environment": worker._environment(),
                  "total": torch.cuda.get_device_properties(0).total_memory}))
"""


def _dataset_task(task_id: str) -> str:
    import pyarrow.parquet as pq

    table = pq.read_table(REPO_ROOT / "data" / "ops-6k-h200" / "tasks.parquet", filters=[("id", "=", task_id)])
    return table.column("code")[0].as_py()


@pytest.mark.parametrize("task_code", [pytest.param(lambda: WIDE_CONV_TASK, id="conv-transpose-1d"),
                                       pytest.param(lambda: _dataset_task("ecfc34a1085db432"), id="ecfc34a1085db432")])
def test_a_worker_of_a_shared_gpu_keeps_cudnn_within_its_share(tmp_path: Path, task_code) -> None:
    """cuDNN runs the first convolution algorithm whose workspace it can allocate: on a GPU with
    memory free, one worker may take most of it (133 GB of an H200 beside two other checks, which
    ran out of memory; the set's task ecfc34a1085db432 overlapped them). A worker told the GPU is
    shared caps the workspace at half its share, in a fresh process (the cap is read before the
    first convolution)."""
    evaluations = 3
    task = tmp_path / "task.py"
    task.write_text(task_code())
    env = {k: v for k, v in child_env().items() if k != "CUDNN_CONV_WSCAP_DBG"}
    probe = subprocess.run([sys.executable, "-c", _CONV_PROBE, str(task), str(evaluations)], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    reply = json.loads(probe.stdout.strip().splitlines()[-1])
    share = reply["total"] // evaluations
    assert int(reply["environment"]["conv_workspace_cap_mb"]) == share // 2 // 2**20
    assert int(reply["environment"]["device_memory_cap_mb"]) == share // 2**20
    assert reply["reserved"] <= share, (reply["reserved"], share)

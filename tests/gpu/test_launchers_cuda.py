"""The fast workdir contract on CUDA: the shim hands a launcher the tensors' device and the stream
torch is using there, and makes its outputs on that device (tests/environment/test_launchers.py
covers the rest on the CPU)."""

from __future__ import annotations

import importlib.util
import secrets
from pathlib import Path

import pytest
import torch

from cuda_agent.environment import BuildConfig, load_solution
from cuda_agent.environment.build import build_solution
from cuda_agent.environment.solution import EXTENSION_NAME

pytestmark = pytest.mark.gpu

STREAM_OF = r"""
#include <cuda_runtime.h>
#include <cuda_agent_launcher.h>

// Writes (device, stream handle) of this call into a new int64 pair on the device, on that stream.
extern "C" int stream_of(cuda_agent_call* call) {
    if (cuda_agent_expect_args(call, 1) || call->args[0].kind != CUDA_AGENT_TENSOR) {
        return cuda_agent_fail(call, "expected one tensor");
    }
    const int64_t two[1] = {2};
    int64_t* out = nullptr;
    if (cuda_agent_output(call, CUDA_AGENT_INT64, 1, two, (void**)&out)) return 1;
    static int64_t pair[2];
    pair[0] = call->device;
    pair[1] = (int64_t)(intptr_t)call->stream;
    cudaMemcpyAsync(out, pair, sizeof pair, cudaMemcpyHostToDevice, cuda_agent_stream(call));
    cudaStreamSynchronize(cuda_agent_stream(call));
    return cuda_agent_launch_status(call);
}
"""


def test_a_launcher_gets_the_current_stream_of_the_tensors_device(tmp_path: Path, session_cache_dir: Path) -> None:
    root = tmp_path / "w"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "stream_of.cu").write_text(STREAM_OF + f"// {secrets.token_hex(8)}\n")
    (root / "model_new.py").write_text("import cuda_extension\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                                       "    pass\n")
    arch = ".".join(map(str, torch.cuda.get_device_capability()))
    built = build_solution(load_solution(root), "cuda", BuildConfig(cuda_arch=arch), session_cache_dir)
    assert built.info.compile_stats["pch_units"] == built.info.compile_stats["torch_imported"] == 0
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, built.extensions_dir / f"{EXTENSION_NAME}.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            out = module.stream_of(x)
        assert out.device == x.device and out.dtype == torch.int64
        assert out.tolist() == [x.device.index, stream.cuda_stream]
    with pytest.raises(RuntimeError, match="stream_of: expected one tensor"):
        module.stream_of(1.0)

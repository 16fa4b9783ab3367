"""Exploit (CUDA only, not compiled or run on CPU CI): a custom kernel launched on a pool stream.

Class: side streams / deferred work. Task: relu (device cuda).
Trick: the C++ wrapper takes a stream from ATen's pool (``at::cuda::getStreamFromPool()``) and
launches the ReLU kernel there, returning before it ran.
Caught by: static guard ``stream-creation`` (checked on CPU too). With the static guards off, on a
GPU: device-wide synchronisation in the timer and the output-stability check after a sync.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

__global__ void relu_kernel(const float* in, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] < 0.0f ? 0.0f : in[i];
}

torch::Tensor relu_forward(torch::Tensor x) {
    torch::Tensor out = torch::empty_like(x);
    const int64_t n = x.numel();
    auto side = at::cuda::getStreamFromPool();
    relu_kernel<<<(n + 255) / 256, 256, 0, side.stream()>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

_ext = load_inline(
    name="redteam_side_stream_pool",
    cpp_sources="torch::Tensor relu_forward(torch::Tensor x);",
    cuda_sources=_cuda_source,
    functions=["relu_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.relu_forward(x.contiguous())

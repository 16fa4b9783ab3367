"""CUDA reference solution for tasks/row_sum.py: one block per row, warp-shuffle + shared-memory reduction."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor row_sum_forward(torch::Tensor x);"

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <vector>

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Sum of v over the whole block, returned to every thread. smem holds >= 32 floats.
// blockDim.x must be a multiple of 32.
__device__ float block_sum(float v, float* smem) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // smem may still be read from a previous call
    if (lane == 0) {
        smem[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < num_warps ? smem[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) {
            smem[0] = v;
        }
    }
    __syncthreads();
    return smem[0];
}

__global__ void row_sum_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t rows, int64_t cols) {
    __shared__ float smem[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = in + r * cols;
        float acc = 0.0f;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            acc += row[j];
        }
        acc = block_sum(acc, smem);
        if (threadIdx.x == 0) {
            out[r] = acc;
        }
    }
}

torch::Tensor row_sum_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "row_sum_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_sum_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "row_sum_forward: x must be contiguous");
    TORCH_CHECK(x.dim() >= 1, "row_sum_forward: x must have at least one dimension");
    const c10::cuda::CUDAGuard device_guard(x.device());

    const int64_t cols = x.size(-1);
    std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end() - 1);
    torch::Tensor out = torch::empty(out_sizes, x.options());
    const int64_t rows = out.numel();
    if (rows == 0) {
        return out;
    }

    constexpr int kThreads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>(rows, 65535));
    row_sum_kernel<<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cuda_row_sum",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["row_sum_forward"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_sum_forward(x.contiguous())

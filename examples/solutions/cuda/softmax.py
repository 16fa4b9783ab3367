"""CUDA reference solution for tasks/softmax.py: one block per row, block-wide max and sum reductions.

Three passes over the row (max, sum of exp(x - max), normalise); the row is re-read from L1/L2.
expf is the accurate libdevice function (no fast-math).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor softmax_forward(torch::Tensor x);"

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Block-wide reductions, result returned to every thread. smem holds >= 32 floats.
// blockDim.x must be a multiple of 32.
__device__ float block_sum(float v, float* smem) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
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

__device__ float block_max(float v, float* smem) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) {
        smem[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < num_warps ? smem[lane] : -INFINITY;
        v = warp_max(v);
        if (lane == 0) {
            smem[0] = v;
        }
    }
    __syncthreads();
    return smem[0];
}

__global__ void softmax_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t rows, int64_t cols) {
    __shared__ float smem[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = in + r * cols;
        float* orow = out + r * cols;

        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            m = fmaxf(m, row[j]);
        }
        m = block_max(m, smem);

        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            s += expf(row[j] - m);
        }
        s = block_sum(s, smem);
        const float inv = 1.0f / s;

        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            orow[j] = expf(row[j] - m) * inv;
        }
    }
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "softmax_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "softmax_forward: x must be contiguous");
    TORCH_CHECK(x.dim() >= 1, "softmax_forward: x must have at least one dimension");
    const c10::cuda::CUDAGuard device_guard(x.device());

    torch::Tensor out = torch::empty(x.sizes(), x.options());
    const int64_t cols = x.size(-1);
    if (cols == 0 || x.numel() == 0) {
        return out;
    }
    const int64_t rows = x.numel() / cols;

    constexpr int kThreads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>(rows, 65535));
    softmax_kernel<<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cuda_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_forward"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_forward(x.contiguous())

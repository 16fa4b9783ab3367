"""CUDA reference solution for tasks/add_relu_mul.py: relu(x + y) * z fused into one grid-stride kernel.

One read of each input and one write, instead of three kernels and two temporaries.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor add_relu_mul_forward(torch::Tensor x, torch::Tensor y, torch::Tensor z);"

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float add_relu_mul1(float a, float b, float c) {
    float s = a + b;
    s = s < 0.0f ? 0.0f : s;
    return s * c;
}

// kVec: the body is processed as float4 (all pointers 16-byte aligned), the tail element-wise.
template <bool kVec>
__global__ void add_relu_mul_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                    const float* __restrict__ z, float* __restrict__ out, int64_t n) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (kVec) {
        const int64_t n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* y4 = reinterpret_cast<const float4*>(y);
        const float4* z4 = reinterpret_cast<const float4*>(z);
        float4* o4 = reinterpret_cast<float4*>(out);
        for (int64_t i = tid; i < n4; i += stride) {
            const float4 a = x4[i];
            const float4 b = y4[i];
            const float4 c = z4[i];
            float4 r;
            r.x = add_relu_mul1(a.x, b.x, c.x);
            r.y = add_relu_mul1(a.y, b.y, c.y);
            r.z = add_relu_mul1(a.z, b.z, c.z);
            r.w = add_relu_mul1(a.w, b.w, c.w);
            o4[i] = r;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + tid; i < n; i += stride) {
        out[i] = add_relu_mul1(x[i], y[i], z[i]);
    }
}

static bool aligned16(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

torch::Tensor add_relu_mul_forward(torch::Tensor x, torch::Tensor y, torch::Tensor z) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda() && z.is_cuda(), "add_relu_mul_forward: inputs must be CUDA tensors");
    TORCH_CHECK(x.device() == y.device() && x.device() == z.device(),
                "add_relu_mul_forward: inputs must be on the same device");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32 &&
                    z.scalar_type() == torch::kFloat32,
                "add_relu_mul_forward: inputs must be float32");
    TORCH_CHECK(x.sizes() == y.sizes() && x.sizes() == z.sizes(),
                "add_relu_mul_forward: inputs must have the same shape");
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && z.is_contiguous(),
                "add_relu_mul_forward: inputs must be contiguous");
    const c10::cuda::CUDAGuard device_guard(x.device());

    torch::Tensor out = torch::empty(x.sizes(), x.options());
    const int64_t n = x.numel();
    if (n == 0) {
        return out;
    }
    const float* px = x.data_ptr<float>();
    const float* py = y.data_ptr<float>();
    const float* pz = z.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const bool vec = aligned16(px) && aligned16(py) && aligned16(pz) && aligned16(o);

    constexpr int kThreads = 256;
    const int64_t work = vec ? std::max<int64_t>(n / 4, 1) : n;
    const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 16;
    const int blocks = static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, max_blocks));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        add_relu_mul_kernel<true><<<blocks, kThreads, 0, stream>>>(px, py, pz, o, n);
    } else {
        add_relu_mul_kernel<false><<<blocks, kThreads, 0, stream>>>(px, py, pz, o, n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cuda_add_relu_mul",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["add_relu_mul_forward"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return _ext.add_relu_mul_forward(x.contiguous(), y.contiguous(), z.contiguous())

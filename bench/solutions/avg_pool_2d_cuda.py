"""An honest CUDA solution for KernelBench level 1, problem 45 (2D average pooling, kernel 11,
stride 11, no padding) on a float32 NCHW input: one thread per output element sums its window in
float32, as PyTorch's kernel does. Used by bench/real_sizes.py on the problem's real 16 GB input."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor avg_pool_forward(torch::Tensor x, int64_t k);"

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

__global__ void avg_pool_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t planes,
                                int64_t height, int64_t width, int64_t out_h, int64_t out_w, int k) {
    const int64_t total = planes * out_h * out_w;
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    const float scale = 1.0f / static_cast<float>(k * k);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t ow = i % out_w;
        const int64_t oh = (i / out_w) % out_h;
        const int64_t plane = i / (out_w * out_h);
        const float* window = in + (plane * height + oh * k) * width + ow * k;
        float sum = 0.0f;
        for (int r = 0; r < k; ++r) {
            for (int c = 0; c < k; ++c) {
                sum += window[static_cast<int64_t>(r) * width + c];
            }
        }
        out[i] = sum * scale;
    }
}

torch::Tensor avg_pool_forward(torch::Tensor x, int64_t k) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 4 && x.is_contiguous(),
                "avg_pool_forward: x must be a contiguous float32 NCHW CUDA tensor");
    const c10::cuda::CUDAGuard device_guard(x.device());
    const int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
    const int64_t out_h = (h - k) / k + 1, out_w = (w - k) / k + 1;
    torch::Tensor out = torch::empty({n, ch, out_h, out_w}, x.options());
    const int64_t total = out.numel();
    if (total == 0) {
        return out;
    }
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535LL * 8);
    avg_pool_kernel<<<static_cast<unsigned int>(blocks), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n * ch, h, w, out_h, out_w, static_cast<int>(k));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_bench_avg_pool_2d",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["avg_pool_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.avg_pool_forward(x, self.kernel_size)

"""CPU reference solution for tasks/rmsnorm.py: per-row sum of squares, then scale by rsqrt and weight.

The parameter `weight` has the same name, shape and initialisation as in the task's Model, so the
harness can load Model's state dict into it (and it would match under the same seed anyway).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <cmath>

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rmsnorm_forward: inputs must be CPU tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32,
                "rmsnorm_forward: inputs must be float32");
    TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "rmsnorm_forward: inputs must be contiguous");
    TORCH_CHECK(x.dim() >= 1, "rmsnorm_forward: x must have at least one dimension");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(weight.dim() == 1 && weight.size(0) == cols,
                "rmsnorm_forward: weight must be 1D with size equal to x.size(-1)");

    torch::Tensor out = torch::empty(x.sizes(), x.options());
    if (cols == 0 || x.numel() == 0) {
        return out;
    }
    const int64_t rows = x.numel() / cols;
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float eps_f = static_cast<float>(eps);

    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* orow = o + r * cols;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int64_t j = 0; j < cols; ++j) {
            acc[j & 7] += row[j] * row[j];
        }
        const float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        const float mean = ss / static_cast<float>(cols);
        const float inv_rms = 1.0f / std::sqrt(mean + eps_f);
        for (int64_t j = 0; j < cols; ++j) {
            orow[j] = (row[j] * inv_rms) * w[j];
        }
    }
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cpu_rmsnorm",
    cpp_sources=cpp_source,
    functions=["rmsnorm_forward"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.rmsnorm_forward(x.contiguous(), self.weight.contiguous(), float(self.eps))

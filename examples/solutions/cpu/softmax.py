"""CPU reference solution for tasks/softmax.py: numerically stable three-pass softmax per row."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <cmath>
#include <limits>

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "softmax_forward: x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "softmax_forward: x must be contiguous");
    TORCH_CHECK(x.dim() >= 1, "softmax_forward: x must have at least one dimension");

    torch::Tensor out = torch::empty(x.sizes(), x.options());
    const int64_t cols = x.size(-1);
    if (cols == 0 || x.numel() == 0) {
        return out;
    }
    const int64_t rows = x.numel() / cols;
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();

    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* orow = o + r * cols;

        // Pass 1: row maximum, subtracted so exp never overflows.
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < cols; ++j) {
            m = row[j] > m ? row[j] : m;
        }

        // Pass 2: exponentials (stored) and their sum over 4 partial accumulators.
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int64_t j = 0; j < cols; ++j) {
            const float e = std::exp(row[j] - m);
            orow[j] = e;
            acc[j & 3] += e;
        }
        const float inv = 1.0f / ((acc[0] + acc[1]) + (acc[2] + acc[3]));

        // Pass 3: normalise.
        for (int64_t j = 0; j < cols; ++j) {
            orow[j] *= inv;
        }
    }
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cpu_softmax",
    cpp_sources=cpp_source,
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

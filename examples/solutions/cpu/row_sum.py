"""CPU reference solution for tasks/row_sum.py: per-row sum with several independent fp32 partial sums.

Splitting each row's sum over 8 accumulators (combined pairwise at the end) keeps the rounding
error close to torch's own blocked summation instead of growing with the row length.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
torch::Tensor row_sum_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "row_sum_forward: x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_sum_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "row_sum_forward: x must be contiguous");
    TORCH_CHECK(x.dim() >= 1, "row_sum_forward: x must have at least one dimension");

    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end() - 1);
    torch::Tensor out = torch::empty(out_sizes, x.options());
    if (cols == 0) {
        return out.zero_();
    }

    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8) {
            for (int k = 0; k < 8; ++k) {
                acc[k] += row[j + k];
            }
        }
        for (; j < cols; ++j) {
            acc[j & 7] += row[j];
        }
        o[r] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cpu_row_sum",
    cpp_sources=cpp_source,
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

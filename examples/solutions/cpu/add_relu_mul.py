"""CPU reference solution for tasks/add_relu_mul.py: relu(x + y) * z fused into a single loop."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
torch::Tensor add_relu_mul_forward(torch::Tensor x, torch::Tensor y, torch::Tensor z) {
    TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu() && z.device().is_cpu(),
                "add_relu_mul_forward: inputs must be CPU tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32 &&
                    z.scalar_type() == torch::kFloat32,
                "add_relu_mul_forward: inputs must be float32");
    TORCH_CHECK(x.sizes() == y.sizes() && x.sizes() == z.sizes(),
                "add_relu_mul_forward: inputs must have the same shape");
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && z.is_contiguous(),
                "add_relu_mul_forward: inputs must be contiguous");

    torch::Tensor out = torch::empty(x.sizes(), x.options());
    const float* px = x.data_ptr<float>();
    const float* py = y.data_ptr<float>();
    const float* pz = z.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        float s = px[i] + py[i];
        s = s < 0.0f ? 0.0f : s;
        o[i] = s * pz[i];
    }
    return out;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cpu_add_relu_mul",
    cpp_sources=cpp_source,
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

"""Agent-workdir CUDA solution for tasks/rmsnorm.py; the kernel lives in kernels/rmsnorm.cu.

`weight` has the same name, shape and initialisation as in the task's Model.
"""

import torch
import torch.nn as nn

import cuda_extension  # built by the harness from kernels/*


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.rmsnorm_forward(x.contiguous(), self.weight.contiguous(), float(self.eps))

"""Agent-workdir CUDA solution for tasks/relu.py in the fast contract: kernels/relu.cu exports the
launcher ``relu_forward``; the harness's shim passes it the tensors."""

import torch
import torch.nn as nn

import cuda_extension  # built by the harness from kernels/*


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.relu_forward(x.contiguous())

"""Agent-workdir CPU solution for tasks/relu.py in the binding contract (kernels/relu_binding.cpp
registers the torch-level function of kernels/relu.cpp): the fast contract's counterpart in
examples/solutions/cpu_workdir/relu, kept to compare the two (bench/compile.py, bench/call_overhead.py)."""

import torch
import torch.nn as nn

import cuda_extension  # built by the harness from kernels/*


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.relu_forward(x.contiguous())

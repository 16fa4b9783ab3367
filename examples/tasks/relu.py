"""Elementwise ReLU over a 4M-element fp32 tensor: the simplest memory-bound kernel."""

import torch
import torch.nn as nn

batch_size = 1024
dim = 4096


class Model(nn.Module):
    """y = relu(x)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

"""Softmax over the last dimension of a 2D fp32 tensor: row-wise max and sum reductions plus exp."""

import torch
import torch.nn as nn

batch_size = 2048
dim = 2048


class Model(nn.Module):
    """y = softmax(x, dim=-1)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

"""Sum over the last dimension of a 2D fp32 tensor (keepdim=False): a row-wise reduction."""

import torch
import torch.nn as nn

batch_size = 2048
dim = 4096


class Model(nn.Module):
    """y[i] = sum_j x[i, j]."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

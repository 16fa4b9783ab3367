"""Three-op elementwise chain relu(x + y) * z: fusing it into one pass saves two round trips to memory."""

import torch
import torch.nn as nn

batch_size = 2048
dim = 2048


class Model(nn.Module):
    """out = relu(x + y) * z, all three inputs of the same shape."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + y) * z


def get_inputs():
    return [
        torch.randn(batch_size, dim),
        torch.randn(batch_size, dim),
        torch.randn(batch_size, dim),
    ]


def get_init_inputs():
    return []

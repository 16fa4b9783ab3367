"""Scaled-dot-product attention kept off cuDNN, for models whose sequence lengths change call to call.

PyTorch's cuDNN attention builds an execution plan for every new shape. Decoding grows the key
length by one each step, so every step builds one: on an H100 (torch 2.11, a 4-layer model under
bfloat16 autocast) a decoding step took 52 ms with cuDNN attention and 7 ms without. Training
batches are padded to a new length almost every time, so their passes stay off it too. The
flash, memory-efficient and math kernels need no plan. Only CUDA is affected; elsewhere this does
nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def without_cudnn_attention(device_type: str) -> Iterator[None]:
    """Runs the block with attention on the flash, memory-efficient or math kernels (``device_type``
    ``cuda``); restores the previous choice afterwards."""
    if device_type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield

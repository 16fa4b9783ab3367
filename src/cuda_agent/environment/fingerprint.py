"""Keyed fingerprints of tensor bytes: "did these bytes change?" without keeping a copy of them.

A GPU-sized input or output cannot be cloned just to check later that nobody wrote into it (a 6 GB
tensor would take 6 GB more). Instead its bytes, read as 64-bit words, are summed with weights
drawn from a secret key (wrapping arithmetic): one read of the tensor, on its own device. Any
change of the bytes changes the sum unless it was crafted against the key, which code outside this
process's harness never sees. The same key gives the same fingerprint for the same bytes, so two
generations of one input set can be compared too.
"""

from __future__ import annotations

import secrets

import torch

from cuda_agent.environment.shared_tensors import flat_bytes

KEY_WORDS = 1 << 20
"""Weights per key (8 MB of int64): a tensor is summed in chunks of this many words."""
_GROUP_WORDS = 1 << 25
"""Words multiplied at once (a 256 MB temporary)."""


class FingerprintKey:
    """The secret weights for one device, drawn once: odd 64-bit words per chunk position, and
    one more odd word per chunk index, so equal chunks at different places fingerprint apart."""

    def __init__(self, device: str | torch.device) -> None:
        generator = torch.Generator(device=device)
        generator.manual_seed(secrets.randbits(63))
        draw = lambda n: torch.randint(-2**62, 2**62, (n,), dtype=torch.int64, device=device,  # noqa: E731
                                       generator=generator) * 2 + 1
        self.weights = draw(KEY_WORDS)
        self._chunk_weights = draw(KEY_WORDS)
        self.device = torch.device(device)

    def __call__(self, tensor: torch.Tensor) -> int:
        """The fingerprint of ``tensor``'s bytes (its dtype and shape are the caller's to compare)."""
        flat = flat_bytes(tensor.detach())
        if flat.storage_offset() % 8:  # 64-bit words need an aligned start
            flat = flat.clone()
        whole = flat.numel() // 8 * 8
        words = flat[:whole].view(torch.int64)
        tail = flat[whole:]
        total = torch.zeros((), dtype=torch.int64, device=flat.device)
        step = _GROUP_WORDS // KEY_WORDS * KEY_WORDS
        for start in range(0, words.numel(), step):
            total += self._group_sum(words[start:start + step], start // KEY_WORDS)
        if tail.numel():
            padded = torch.zeros(8, dtype=torch.uint8, device=flat.device)
            padded[:tail.numel()] = tail
            total += padded.view(torch.int64)[0] * self.weights[0] * 3
        return int(total.item()) ^ flat.numel()

    def _group_sum(self, words: torch.Tensor, first_chunk: int) -> torch.Tensor:
        """Weighted sum of consecutive chunks; each chunk's sum weighted by its index's word."""
        full = words.numel() // KEY_WORDS
        total = torch.zeros((), dtype=torch.int64, device=words.device)
        if full:
            grid = words[:full * KEY_WORDS].view(full, KEY_WORDS)
            sums = (grid * self.weights).sum(dim=1)
            indices = torch.arange(first_chunk, first_chunk + full, device=words.device) % KEY_WORDS
            total += (sums * self._chunk_weights[indices]).sum()
        rest = words[full * KEY_WORDS:]
        if rest.numel():
            index = (first_chunk + full) % KEY_WORDS
            total += (rest * self.weights[:rest.numel()]).sum() * self._chunk_weights[index]
        return total

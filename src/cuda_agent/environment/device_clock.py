"""The GPU's SM clock, read by the parent process from NVML (no CUDA context) right after a timing.

On H200s, about one verdict in twenty timed its candidate 1.8-4.8x slower than the others of the
same solution, with a tight error inside the verdict: the whole timing ran slow, against baselines
from the cache. An idle H200 reads 345 MHz and a busy one 1980 MHz, so the clock is the first
suspect; each verdict records it beside its timings (``environment["sm_clock_mhz_*"]``) so that a
slow verdict can be told from a slow candidate.
"""

from __future__ import annotations


def sm_clock_mhz(device: str) -> int | None:
    """The current SM clock of the evaluation's GPU (the first visible one), in MHz; None on the
    CPU backend or where NVML cannot be read (``nvidia-ml-py`` missing, no driver)."""
    if device != "cuda":
        return None
    try:
        import torch

        return int(torch.cuda.clock_rate(0))  # an index, not None: None would make a CUDA context here
    except Exception:  # noqa: BLE001 - a diagnostic: the verdict stands without it
        return None

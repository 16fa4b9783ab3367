"""The GPU's SM clock, read from NVML: by the parent process (no CUDA context) right after a
timing, and by a timing loop deciding whether it must wait for the clock to ramp.

On H200s, about one verdict in twenty timed its candidate 1.8-4.8x slower than the others of the
same solution, with a tight error inside the verdict: the whole timing ran slow, against baselines
from the cache. An idle H200 reads 345 MHz and a busy one 1980 MHz, so the clock is the first
suspect; each verdict records it beside its timings (``environment["sm_clock_mhz_*"]``) so that a
slow verdict can be told from a slow candidate.
"""

from __future__ import annotations

import functools

RAMPED = 0.95
"""An SM clock at this share of its maximum or above has ramped up."""


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


def sm_clock_ramped(device: str) -> bool:
    """Whether the evaluation's GPU (the first visible one) reads its SM clock within ``RAMPED`` of
    its maximum now: NVML's reading averages over the last 1/6-1 s, so the GPU was busy just before,
    and a timing loop need not wait out ``timing.warmup_ms`` for the clock to come up. On one H200
    the clock reached 1980 MHz within 3 ms of work and still read it after 3 s idle with a context
    open (``bench/clock_warmup.py``). False on the CPU backend or where NVML cannot be read: the
    loop then waits as before."""
    current = sm_clock_mhz(device)
    if current is None:
        return False
    try:
        maximum = _sm_clock_maximum_mhz()
    except Exception:  # noqa: BLE001 - the warm-up's wait stands without it
        return False
    return current >= RAMPED * maximum > 0


@functools.lru_cache(maxsize=1)
def _sm_clock_maximum_mhz() -> int:
    """The first visible GPU's maximum SM clock, read once per process (through torch's handle,
    which maps ``CUDA_VISIBLE_DEVICES`` to NVML's order, as ``torch.cuda.clock_rate`` does)."""
    import pynvml
    import torch

    handle = torch.cuda._get_pynvml_handler(0)  # noqa: SLF001 - torch's own mapping
    return int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))

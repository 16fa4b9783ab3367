"""Which device each synthesis lane measures on: one group of lanes per GPU of the host.

A lane's processes (a composer sizing tasks, a filter's reference worker) see exactly one GPU:
``CUDA_VISIBLE_DEVICES`` is set to that GPU's entry, so ``cuda`` inside them is that GPU. This
process names the same GPU ``cuda:<index>`` (its position among the GPUs visible here), and the
measurement lock (:mod:`cuda_agent.synth.device_lock`) resolves both names to the physical GPU.

On the CPU backend a lane group is a name with its own measurement lock (``cpu``, or ``cpu:0``,
``cpu:1`` ...): the groups share the cores, so their timings can overlap; they exist so that the
scheduling of several device groups runs, and is tested, without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

ENV_VAR = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class LaneDevice:
    """One device that a group of lanes measures on."""

    name: str
    """``cuda:<index>`` (this process's numbering), ``cpu`` or ``cpu:<k>``: the measurement lock's
    name here, and the prefix of its lanes' names."""
    visible: str | None = None
    """The ``CUDA_VISIBLE_DEVICES`` entry the lane's processes get (an index or ``GPU-<uuid>``);
    ``None`` on the CPU backend, where they see no GPU."""

    def env(self) -> dict[str, str]:
        """Environment entries for a process that works on this device."""
        return {ENV_VAR: "" if self.visible is None else self.visible}


def listed_gpu_entries() -> list[str] | None:
    """The entries of this process's ``CUDA_VISIBLE_DEVICES``; ``None`` when it is not set."""
    listed = os.environ.get(ENV_VAR)
    if listed is None:
        return None
    return [entry.strip() for entry in listed.split(",") if entry.strip() and entry.strip() != "-1"]


def visible_gpu_entries() -> list[str]:
    """This process's GPUs as ``CUDA_VISIBLE_DEVICES`` entries, in its own index order."""
    listed = listed_gpu_entries()
    if listed is None:
        import torch

        return [str(index) for index in range(torch.cuda.device_count())]
    return listed


def lane_devices(backend: str, devices: Sequence[str] | None = None) -> list[LaneDevice]:
    """The devices a run's lanes are spread over.

    Args:
        backend: ``cuda`` or ``cpu``.
        devices: on ``cuda``, the GPUs to use as ``CUDA_VISIBLE_DEVICES`` entries of this
            process (``["0", "2"]``), ``None`` for every visible GPU; on ``cpu``, lane group names
            (``["cpu:0", "cpu:1"]``), ``None`` for one group, ``cpu``.

    Raises:
        ValueError: a GPU that is not visible here, a repeated entry, no GPU at all on ``cuda``,
            or a CPU group not named ``cpu`` / ``cpu:<k>``.
    """
    if devices is not None and len(set(devices)) != len(devices):
        raise ValueError(f"synth: devices lists a device twice: {list(devices)}")
    if backend == "cpu":
        names = list(devices) if devices else ["cpu"]
        wrong = [name for name in names if not (name == "cpu" or (name.startswith("cpu:") and name[4:].isdigit()))]
        if wrong:
            raise ValueError(f"synth: on the cpu backend, devices are lane groups named cpu or cpu:<k>, got {wrong}")
        return [LaneDevice(name) for name in names]
    visible = visible_gpu_entries()
    if not visible:
        raise ValueError(f"synth: device is cuda but no GPU is visible ({ENV_VAR}={os.environ.get(ENV_VAR)!r})")
    chosen = list(devices) if devices else visible
    missing = [entry for entry in chosen if entry not in visible]
    if missing:
        raise ValueError(f"synth: GPU(s) {missing} are not visible here; visible {ENV_VAR} entries: {visible}")
    return [LaneDevice(f"cuda:{visible.index(entry)}", entry) for entry in chosen]


def spread(lanes: int, devices: Sequence[LaneDevice]) -> list[LaneDevice]:
    """The device of each of ``lanes`` lanes: round robin, so groups differ by one lane at most."""
    if lanes < 1 or not devices:
        raise ValueError(f"synth: need at least one lane and one device, got {lanes} lanes on {list(devices)}")
    return [devices[index % len(devices)] for index in range(lanes)]


def describe_gpus(devices: Sequence[LaneDevice]) -> list[str]:
    """The model name of each GPU in ``devices`` (``NVIDIA H100 80GB HBM3``); empty on the CPU backend."""
    gpus = [device for device in devices if device.visible is not None]
    if not gpus:
        return []
    import torch

    return [torch.cuda.get_device_name(int(device.name.split(":")[1])) for device in gpus]

"""The driver version a verdict reports is read from the NVIDIA kernel module's banner, so a worker
warming up on a shared GPU does not hold it through an ``nvidia-smi`` subprocess."""

from __future__ import annotations

import pytest

from cuda_agent.environment.reference_worker import driver_from_banner


@pytest.mark.parametrize(("banner", "version"), [
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
     "(dvs-builder@U22-I3-AE18-23-3)  Thu Jul 10 2025\nGCC version:  gcc version 13.3.0", "580.159.04"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023", "535.104.05"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  560.35  Release Build", "560.35"),
    ("NVRM version: NVIDIA UNIX Kernel Module 580.159.04", "580.159.04"),
])
def test_the_driver_version_is_read_from_the_kernel_modules_banner(banner: str, version: str) -> None:
    assert driver_from_banner(banner) == version


@pytest.mark.parametrize("banner", ["", "NVRM version: unexpected",
                                    "NVRM version: NVIDIA UNIX Kernel Module for x86_64"])
def test_a_banner_without_a_version_names_none(banner: str) -> None:
    assert driver_from_banner(banner) is None

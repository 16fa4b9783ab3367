"""Configuration of the static guards."""

from __future__ import annotations

import re
from dataclasses import dataclass

KNOWN_LIBRARIES = ("cublas", "cublasLt", "cudnn", "cufft", "cusparse", "curand", "cusolver", "cutensor", "nccl")
"""Vendor libraries the ``library-call`` guard recognises (by the prefix of their C API names)."""

_EXTRA_CALL = re.compile(r"^(torch|Tensor)(\.[A-Za-z_][A-Za-z0-9_]*)+$")


class GuardConfigError(ValueError):
    """A guard configuration value is invalid; the message names the field, the value and the fix."""


@dataclass(frozen=True)
class GuardConfig:
    allowed_libraries: tuple[str, ...] = ("cublas", "cublasLt", "cudnn")
    """Vendor libraries a candidate may call (the CUDA Agent rules allow cuBLAS/cuDNN for GEMM and
    convolution). Names come from ``KNOWN_LIBRARIES``; calls into any other one are ``library-call``."""
    allow_streams: bool = False
    """Allow creating or switching CUDA streams (and CUDA graph capture). Off by default: work on a
    side stream can escape the timed region."""
    extra_allowed_torch_calls: tuple[str, ...] = ()
    """Further PyTorch calls allowed in ``ModelNew.forward``: ``"torch.cat"`` (a function, by its full
    name) or ``"Tensor.clamp_"`` (a tensor method)."""
    enabled: bool = True
    """Run the static guards at all (off: ``run_static_guards`` reports nothing)."""

    def __post_init__(self) -> None:
        for name, value in (
            ("allowed_libraries", self.allowed_libraries),
            ("extra_allowed_torch_calls", self.extra_allowed_torch_calls),
        ):
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise GuardConfigError(f"guards.{name} must be a tuple of strings, got {value!r}")
        unknown = [lib for lib in self.allowed_libraries if lib not in KNOWN_LIBRARIES]
        if unknown:
            raise GuardConfigError(
                f"guards.allowed_libraries has unknown libraries {unknown}; valid: {', '.join(KNOWN_LIBRARIES)}"
            )
        bad = [call for call in self.extra_allowed_torch_calls if not _EXTRA_CALL.match(call)]
        if bad:
            raise GuardConfigError(
                f"guards.extra_allowed_torch_calls entries {bad} are malformed; write a function as "
                "'torch.<path>' (e.g. 'torch.cat') or a tensor method as 'Tensor.<name>' (e.g. 'Tensor.clamp_')"
            )
        for name in ("allow_streams", "enabled"):
            if not isinstance(getattr(self, name), bool):
                raise GuardConfigError(f"guards.{name} must be a bool, got {getattr(self, name)!r}")

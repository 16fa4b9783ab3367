"""Device memory two processes share, through the CUDA driver's IPC handles.

The reference worker hands the candidate its inputs, and the candidate hands back its outputs, as
64-byte IPC handles over the private channel: the receiving process maps the sender's allocation
and reads it in place, with no copy through the host. torch's own CUDA sharing also needs a
reference-count file in ``/dev/shm``, which the candidate's sandbox replaces with a private tmpfs;
the driver's handles need nothing beside themselves, and they open across the sandbox's uid and
network and mount namespaces (checked on an H200, 2026-11-27).

Only this module talks to ``libcuda``; everything else sees :class:`DeviceBlock` and
:class:`MappedBlock`, which give out ``uint8`` tensors over their memory.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

HANDLE_BYTES = 64
_LAZY_ENABLE_PEER_ACCESS = 1


class CudaIpcError(RuntimeError):
    """A driver call failed; the message names the call and the driver's error."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]


_library: ctypes.CDLL | None = None
_library_lock = threading.Lock()
_block_bytes = [0, 0]
"""Bytes of :class:`DeviceBlock` memory held now, and the most held at once (torch's allocator
statistics do not see these blocks)."""


def peak_block_bytes() -> int:
    """The most :class:`DeviceBlock` memory this process held at once."""
    return _block_bytes[1]


def _driver() -> ctypes.CDLL:
    global _library
    with _library_lock:
        if _library is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                raise CudaIpcError(f"cannot load the CUDA driver library libcuda.so.1: {exc}") from None
            size_t, ptr = ctypes.c_size_t, ctypes.c_uint64
            signatures = {
                "cuMemAlloc_v2": [ctypes.POINTER(ptr), size_t],
                "cuMemFree_v2": [ptr],
                "cuMemGetAddressRange_v2": [ctypes.POINTER(ptr), ctypes.POINTER(size_t), ptr],
                "cuIpcGetMemHandle": [ctypes.POINTER(_Handle), ptr],
                "cuIpcOpenMemHandle_v2": [ctypes.POINTER(ptr), _Handle, ctypes.c_uint],
                "cuIpcCloseMemHandle": [ptr],
                "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            }
            for name, argtypes in signatures.items():
                function = getattr(lib, name)
                function.argtypes, function.restype = argtypes, ctypes.c_int
            _library = lib
    return _library


def _check(result: int, call: str) -> None:
    if result != 0:
        message = ctypes.c_char_p()
        _driver().cuGetErrorString(result, ctypes.byref(message))
        text = message.value.decode() if message.value else "unknown error"
        raise CudaIpcError(f"{call} failed: CUDA driver error {result} ({text})")


def _ready() -> None:
    """The calling thread has torch's primary context current (the driver calls act in it)."""
    torch.cuda.init()
    torch.cuda.current_stream().synchronize()


class _ArrayInterface:
    """What ``torch.as_tensor`` needs to view raw device memory without copying it."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3}


def _bytes_at(address: int, nbytes: int) -> torch.Tensor:
    return torch.as_tensor(_ArrayInterface(address, nbytes), device="cuda")


def allocation_range(address: int) -> tuple[int, int]:
    """``(base, size)`` of the driver allocation that holds device ``address``."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(_driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), address),
           "cuMemGetAddressRange")
    return base.value, size.value


def export_handle(base: int) -> str:
    """The IPC handle (hex) of the allocation that starts at device address ``base``: another
    process opens all of it (a caching allocator's segment: every tensor it holds)."""
    handle = _Handle()
    _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), base), "cuIpcGetMemHandle")
    return bytes(handle.reserved).hex()


class DeviceBlock:
    """Device memory this process allocated directly from the driver (outside torch's caching
    allocator, so a handle to it exposes exactly these bytes and nothing else of this process)."""

    def __init__(self, nbytes: int) -> None:
        _ready()
        address = ctypes.c_uint64()
        _check(_driver().cuMemAlloc_v2(ctypes.byref(address), max(nbytes, 1)), f"cuMemAlloc of {nbytes} bytes")
        self.address, self.nbytes = address.value, nbytes
        _block_bytes[0] += nbytes
        _block_bytes[1] = max(_block_bytes)
        self.bytes = _bytes_at(self.address, max(nbytes, 1))[:nbytes]
        """The block as a ``uint8`` tensor (views of it are how the memory is used)."""

    def handle(self) -> str:
        """The IPC handle another process opens this block with (hex)."""
        return export_handle(self.address)

    def free(self) -> None:
        """Give the memory back (after every tensor over it is gone). Idempotent."""
        if self.address:
            self.bytes = None
            torch.cuda.synchronize()
            _check(_driver().cuMemFree_v2(self.address), "cuMemFree")
            self.address = 0
            _block_bytes[0] -= self.nbytes


class MappedBlock:
    """Another process's device allocation, mapped into this one from its IPC handle."""

    def __init__(self, handle_hex: str) -> None:
        raw = _parse_handle(handle_hex)
        _ready()
        handle = _Handle()
        ctypes.memmove(ctypes.addressof(handle), raw, HANDLE_BYTES)
        address = ctypes.c_uint64()
        _check(_driver().cuIpcOpenMemHandle_v2(ctypes.byref(address), handle, _LAZY_ENABLE_PEER_ACCESS),
               "cuIpcOpenMemHandle")
        self.address = address.value
        self.nbytes = allocation_range(self.address)[1]
        self.bytes = _bytes_at(self.address, self.nbytes)

    def close(self) -> None:
        """Unmap (after every tensor over it is gone). Idempotent."""
        if self.address:
            self.bytes = None
            torch.cuda.synchronize()
            _check(_driver().cuIpcCloseMemHandle(self.address), "cuIpcCloseMemHandle")
            self.address = 0


def _parse_handle(text: Any) -> bytes:
    if not isinstance(text, str) or len(text) != 2 * HANDLE_BYTES:
        raise CudaIpcError(f"an IPC handle is {HANDLE_BYTES} bytes as hex, got {str(text)[:80]!r}")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise CudaIpcError(f"an IPC handle is {HANDLE_BYTES} bytes as hex, got {text[:80]!r}") from None

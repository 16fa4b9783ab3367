"""What ``ModelNew.forward`` and the extension's host code may use of PyTorch, and what counts as compute.

Everything here is an allow-list: a PyTorch call that is not listed is a compute fallback. The lists
are documented in docs/guards.md; change them there and here together.
"""

from __future__ import annotations

import os
from functools import lru_cache

# -- Python: torch functions allowed in forward, with the kind of value they return -------------------
TENSOR, SCALAR, EXTENSION = "tensor", "scalar", "ext"

ALLOWED_TORCH_CALLS: dict[str, str] = {
    # Allocation: the output buffers a kernel writes into.
    **{f"torch.{name}": TENSOR for name in (
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
        "tensor")},
    # The function forms of the view methods allowed below.
    **{f"torch.{name}": TENSOR for name in (
        "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose", "permute", "t", "narrow", "select",
        "movedim", "moveaxis", "swapaxes", "swapdims", "split", "chunk", "unbind", "tensor_split", "as_strided")},
    # Metadata, dtypes and shapes: no tensor data is read or written.
    **{f"torch.{name}": SCALAR for name in (
        "Size", "device", "is_tensor", "numel", "get_default_dtype", "is_grad_enabled", "is_inference_mode_enabled",
        "finfo", "iinfo", "broadcast_shapes", "promote_types", "result_type", "can_cast", "is_floating_point",
        "is_complex", "no_grad", "inference_mode", "_assert")},
    # Device management and synchronisation (streams are the stream-creation guard's business).
    **{f"torch.cuda.{name}": SCALAR for name in (
        "synchronize", "current_stream", "default_stream", "current_device", "device_count", "is_available",
        "get_device_properties", "get_device_capability", "get_device_name", "device", "Event",
        "nvtx.range_push", "nvtx.range_pop", "nvtx.range")},
    "torch.autograd.profiler.record_function": SCALAR,
    "torch.profiler.record_function": SCALAR,
    "torch.jit.is_scripting": SCALAR,
    "torch.jit.is_tracing": SCALAR,
    "torch.compiler.is_compiling": SCALAR,
    # Building the extension (a lazily built load_inline module is still the extension).
    "torch.utils.cpp_extension.load_inline": EXTENSION,
    "torch.utils.cpp_extension.load": EXTENSION,
}

# torch.* names that may be passed around as values (dtype=torch.float32, memory_format=...).
TORCH_VALUE_NAMES = frozenset({
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "int8", "uint8", "int16", "short",
    "int32", "int", "int64", "long", "bool", "complex64", "complex128", "cfloat", "cdouble", "float8_e4m3fn",
    "float8_e5m2", "uint16", "uint32", "uint64", "contiguous_format", "channels_last", "channels_last_3d",
    "preserve_format", "strided", "sparse_coo", "Tensor", "Size", "dtype", "device", "layout", "memory_format",
    "inf", "nan", "pi", "e", "cuda", "cpu",
})

# -- Python: tensor methods allowed in forward ----------------------------------------------------------
ALLOWED_TENSOR_METHODS: dict[str, str] = {
    # Views and layout: no arithmetic (``contiguous`` copies only when the layout requires it).
    **{name: TENSOR for name in (
        "view", "view_as", "reshape", "reshape_as", "contiguous", "unsqueeze", "squeeze", "flatten", "unflatten",
        "permute", "transpose", "t", "expand", "expand_as", "narrow", "select", "as_strided", "movedim", "moveaxis",
        "swapaxes", "swapdims", "unfold", "split", "chunk", "unbind", "tensor_split")},
    # Placement and floating-point dtype (float32 <-> float16/bfloat16/float64 casts).
    **{name: TENSOR for name in ("to", "cuda", "cpu", "float", "double", "half", "bfloat16", "type_as")},
    # Buffers: copies, fills and allocation like the ones torch.empty/zeros make.
    **{name: TENSOR for name in (
        "detach", "clone", "copy_", "zero_", "fill_", "requires_grad_", "new_empty", "new_zeros", "new_ones",
        "new_full", "new_empty_strided")},
    # Metadata.
    **{name: SCALAR for name in (
        "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset", "is_contiguous", "data_ptr",
        "element_size", "get_device", "is_floating_point", "is_complex", "is_signed", "item", "record_stream",
        "is_pinned", "dim_order")},
}

TENSOR_SCALAR_ATTRIBUTES = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_leaf", "requires_grad", "layout", "is_sparse",
    "is_quantized", "is_meta", "itemsize", "nbytes", "names", "is_nested", "is_mkldnn", "output_nr",
})
TENSOR_VIEW_ATTRIBUTES = frozenset({"T", "mT", "data", "real", "imag"})

# Method names that are also list/dict/str methods: on a value of unknown type they are not flagged.
CONTAINER_METHOD_NAMES = frozenset({"values", "index", "count", "copy", "type", "split", "apply_", "map_"})

# Python modules forward may call into besides torch and the extension (scalar helpers only).
ALLOWED_MODULE_CALLS = ("math.", "warnings.", "logging.", "typing.", "operator.index", "time.perf_counter",
                        "time.monotonic")

# Builtins that compute on tensors when given one (``sum(list_of_tensors)``, ``abs(x)``).
TENSOR_SENSITIVE_BUILTINS = frozenset({"sum", "abs", "pow", "round", "divmod", "min", "max", "sorted", "all", "any"})

# -- C++: what host code may use of ATen -----------------------------------------------------------------
# Paths below torch:: / at:: / c10:: (namespace root removed) that may be called or referenced.
CPP_ALLOWED_PATHS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "from_blob", "reshape", "flatten", "squeeze", "unsqueeze", "transpose", "permute", "narrow", "select", "t",
    "movedim", "split", "chunk", "unbind", "as_strided", "TensorOptions", "Tensor", "Device", "Scalar", "IntArrayRef", "ArrayRef", "SmallVector",
    "ScalarType", "dtype", "device", "layout", "elementSize", "toString", "irange", "optional", "nullopt",
    "make_optional", "Half", "BFloat16", "complex", "str", "MemoryFormat", "Layout", "DeviceType", "NoGradGuard",
    "InferenceMode", "parallel_for", "get_num_threads", "get_thread_num", "in_parallel_region", "ceil_div",
    "acc_type", "opmath_type", "RestrictPtrTraits", "DefaultPtrTraits", "PackedTensorAccessor",
    "PackedTensorAccessor32", "PackedTensorAccessor64", "GenericPackedTensorAccessor", "TensorAccessor",
    "typeMetaToScalarType", "isFloatingType", "isComplexType", "isIntegralType", "CppTypeToScalarType",
    "Error", "IndexError", "ValueError", "TypeError", "NotImplementedError", "detail::scalar_type",
    "cuda::getCurrentCUDAStream", "cuda::getDefaultCUDAStream", "cuda::getCurrentDeviceProperties",
    "cuda::getDeviceProperties", "cuda::CUDAGuard", "cuda::OptionalCUDAGuard", "cuda::current_device",
    "cuda::device_count", "cuda::CUDAStream", "cuda::getCurrentCUDABlasHandle", "cuda::getCurrentCUDABlasLtHandle",
    "cuda::getCurrentCUDASparseHandle", "cuda::getCurrentCUDASolverDnHandle", "cuda::CUDACachingAllocator::raw_alloc",
    "cuda::CUDACachingAllocator::raw_delete", "cuda::CUDACachingAllocator::raw_alloc_with_stream",
    "cuda::synchronize", "cuda::is_available", "cuda::warp_size", "cuda::getApplyGrid", "cuda::getApplyBlock",
    "cuda::ATenCeilDiv",
})
# Heads whose whole subtree is allowed (enumerators: ScalarType::Float, MemoryFormat::Contiguous, ...).
CPP_ALLOWED_HEADS = frozenset({"ScalarType", "MemoryFormat", "Layout", "DeviceType", "kCUDA", "kCPU"})
# Namespaces under torch::/at::/c10:: that are compute (or call compute) whatever the name.
CPP_COMPUTE_NAMESPACES = frozenset({"native", "nn", "functional", "_ops", "linalg", "fft", "special", "jit",
                                    "autograd", "Dispatcher", "redispatch", "compositeimplicitautograd",
                                    "compositeexplicitautograd", "cuda::blas", "sparse", "meta", "cpu", "vec"})
CPP_ROOTS = frozenset({"torch", "at", "c10", "caffe2", "aten"})

CPP_ALLOWED_TENSOR_METHODS = frozenset({
    "size", "sizes", "sym_sizes", "stride", "strides", "numel", "dim", "ndimension", "data_ptr", "const_data_ptr",
    "mutable_data_ptr", "data", "contiguous", "is_contiguous", "view", "reshape", "options", "scalar_type", "dtype",
    "device", "is_cuda", "is_cpu", "get_device", "element_size", "itemsize", "nbytes", "storage_offset",
    "defined", "layout", "suggest_memory_format", "is_non_overlapping_and_dense", "packed_accessor32",
    "packed_accessor64", "generic_packed_accessor", "accessor", "expect_contiguous", "to", "cuda", "cpu", "clone",
    "copy_", "fill_", "zero_", "resize_", "transpose", "permute", "unsqueeze", "squeeze", "flatten", "narrow",
    "select", "slice", "expand", "t", "as_strided", "is_floating_point", "is_complex", "requires_grad", "detach",
    "item", "type", "toType", "is_same", "is_same_size",
    "view_as", "reshape_as", "expand_as", "movedim", "unflatten", "split", "chunk", "unbind", "new_empty",
    "new_zeros", "new_ones", "new_full", "float", "double", "half", "bfloat16",
})
# Non-tensor classes share these method names; on a receiver of unknown type they are not flagged.
CPP_CONTAINER_METHOD_NAMES = frozenset({"data", "values", "index", "resize", "any", "all", "type", "swap", "fill",
                                        "count", "at", "get", "set", "find", "sync", "begin", "end", "str"})
# Free functions (scalar math, std algorithms) that share a name with an ATen op: an unqualified call
# is flagged only when an argument is a tensor.
CPP_COMMON_FREE_FUNCTIONS = frozenset({
    "min", "max", "abs", "exp", "exp2", "log", "log2", "log10", "sqrt", "rsqrt", "pow", "floor", "ceil", "round",
    "trunc", "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "atan2", "erf", "erfc", "log1p",
    "expm1", "fmod", "remainder", "fmax", "fmin", "hypot", "sign", "isnan", "isinf", "isfinite", "lgamma",
    "copysign", "nextafter", "frexp", "ldexp", "clamp", "sigmoid", "fabs", "cbrt", "lerp", "square", "swap",
    "fill", "copy", "all", "any", "count", "sort", "where", "empty", "size", "data",
})


@lru_cache(maxsize=1)
def _installed_torch_names() -> dict[str, list[str]]:
    """The names the guards need from the installed torch: its ``Tensor`` methods and its compute
    namespaces. Read once per torch installation and kept in the cache directory, so that the
    trusted parent does not import torch (seconds) for every evaluation's static guards."""
    import hashlib
    import importlib.metadata
    import importlib.util
    import json

    from cuda_agent.environment.config import default_cache_dir

    spec = importlib.util.find_spec("torch")
    installation = f"{importlib.metadata.version('torch')}@{spec.origin if spec else ''}"
    path = default_cache_dir() / "guards" / f"torch-names-{hashlib.sha256(installation.encode()).hexdigest()[:16]}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    import torch
    import torch.nn.functional as functional

    names = {
        "tensor_methods": sorted(n for n in dir(torch.Tensor) if n not in dir(object)),
        "compute": sorted(set(dir(torch._C._VariableFunctions)) | set(dir(functional)).union(
            *(dir(getattr(torch._C, sub, object)) for sub in ("_nn", "_linalg", "_fft", "_special")))),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(names))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache: computed again next time
    return names


def tensor_method_names() -> frozenset[str]:
    """Every ``torch.Tensor`` method/attribute name (from the installed torch)."""
    return frozenset(_installed_torch_names()["tensor_methods"])


@lru_cache(maxsize=1)
def aten_compute_names() -> frozenset[str]:
    """Names of PyTorch compute ops (functions, tensor methods, functional ops) from the installed torch,
    minus everything allowed above. Used where the type of a C++ receiver or the target of an
    unqualified C++ call is unknown."""
    names = set(_installed_torch_names()["compute"]) | tensor_method_names()
    names = {n for n in names if not n.startswith("__") and n.isidentifier()}
    return frozenset(names - CPP_ALLOWED_TENSOR_METHODS - set(CPP_ALLOWED_PATHS) - set(ALLOWED_TENSOR_METHODS))

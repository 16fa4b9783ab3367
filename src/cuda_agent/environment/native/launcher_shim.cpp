// cuda-agent's launcher shim: the tensor glue of the fast workdir contract, compiled once per
// toolchain by the trusted side and linked into every such workdir's cuda_extension module.
//
// It defines the module: one function per entry of the launcher table the protected build
// generates from the kernels' exported symbols. A call describes its Python arguments
// (tensors, ints, floats, bools) in a cuda_agent_call, selects the tensors' device and its
// current stream, calls the launcher and returns the outputs the launcher allocated through it:
// no pybind11, no tensor copies, CPython's METH_FASTCALL calling convention.
#include <Python.h>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/python_variable.h>
#ifdef CUDA_AGENT_SHIM_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <exception>
#include <optional>

#include "cuda_agent_launcher.h"

extern "C" const cuda_agent_launcher_entry cuda_agent_launchers[];
extern "C" const int cuda_agent_launcher_count;

namespace {

constexpr const char* kCapsule = "cuda_agent.launcher";

int dtype_code(at::ScalarType type) {
    switch (type) {
        case at::kFloat: return CUDA_AGENT_FLOAT32;
        case at::kDouble: return CUDA_AGENT_FLOAT64;
        case at::kHalf: return CUDA_AGENT_FLOAT16;
        case at::kBFloat16: return CUDA_AGENT_BFLOAT16;
        case at::kLong: return CUDA_AGENT_INT64;
        case at::kInt: return CUDA_AGENT_INT32;
        case at::kShort: return CUDA_AGENT_INT16;
        case at::kChar: return CUDA_AGENT_INT8;
        case at::kByte: return CUDA_AGENT_UINT8;
        case at::kBool: return CUDA_AGENT_BOOL;
        default: return -1;
    }
}

bool scalar_type(int32_t code, at::ScalarType& type) {
    static const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong,
                                           at::kInt, at::kShort, at::kChar, at::kByte, at::kBool};
    if (code < 0 || code >= static_cast<int32_t>(sizeof types / sizeof types[0])) {
        return false;
    }
    type = types[code];
    return true;
}

struct Outputs {
    c10::Device device;
    int count = 0;
    at::Tensor tensors[CUDA_AGENT_MAX_OUTPUTS];
};

int allocate(cuda_agent_call* call, int32_t dtype, int32_t ndim, const int64_t* sizes, void** data) {
    auto* outputs = static_cast<Outputs*>(call->shim);
    at::ScalarType type;
    if (outputs->count == CUDA_AGENT_MAX_OUTPUTS) {
        return cuda_agent_fail(call, "more than %d outputs", CUDA_AGENT_MAX_OUTPUTS);
    }
    if (!scalar_type(dtype, type) || ndim < 0 || ndim > CUDA_AGENT_MAX_DIMS || (ndim > 0 && sizes == nullptr)) {
        return cuda_agent_fail(call, "output %d: dtype code %d with %d dimensions cannot be made", outputs->count,
                               dtype, ndim);
    }
    try {
        at::Tensor tensor = at::empty(at::IntArrayRef(sizes, static_cast<size_t>(ndim)),
                                      at::TensorOptions().dtype(type).device(outputs->device));
        *data = tensor.data_ptr();
        outputs->tensors[outputs->count++] = std::move(tensor);
    } catch (const std::exception& error) {
        return cuda_agent_fail(call, "output %d: %s", outputs->count, error.what());
    }
    return 0;
}

PyObject* returned(Outputs& outputs) {
    if (outputs.count == 0) {
        Py_RETURN_NONE;
    }
    if (outputs.count == 1) {
        return THPVariable_Wrap(std::move(outputs.tensors[0]));
    }
    PyObject* tuple = PyTuple_New(outputs.count);
    for (int i = 0; tuple != nullptr && i < outputs.count; ++i) {
        PyObject* tensor = THPVariable_Wrap(std::move(outputs.tensors[i]));
        if (tensor == nullptr) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, i, tensor);
    }
    return tuple;
}

// Fills `arg` from `object`; false with a Python exception set when it cannot be passed.
bool describe(const char* name, Py_ssize_t index, PyObject* object, cuda_agent_arg& arg,
              std::optional<c10::Device>& device) {
    arg.kind = CUDA_AGENT_TENSOR;
    if (THPVariable_Check(object)) {
        const at::Tensor& tensor = THPVariable_Unpack(object);
        if (!tensor.defined() || tensor.dim() > CUDA_AGENT_MAX_DIMS || dtype_code(tensor.scalar_type()) < 0) {
            PyErr_Format(PyExc_TypeError, "%s: argument %zd: a defined tensor of at most %d dimensions and a "
                         "supported dtype (see cuda_agent_launcher.h), not %s", name, index, CUDA_AGENT_MAX_DIMS,
                         tensor.defined() ? c10::toString(tensor.scalar_type()) : "undefined");
            return false;
        }
        if (device && *device != tensor.device()) {
            PyErr_Format(PyExc_ValueError, "%s: argument %zd is on %s, an earlier one on %s", name, index,
                         tensor.device().str().c_str(), device->str().c_str());
            return false;
        }
        device = tensor.device();
        arg.dtype = dtype_code(tensor.scalar_type());
        arg.ndim = static_cast<int32_t>(tensor.dim());
        arg.data = tensor.data_ptr();
        arg.numel = tensor.numel();
        for (int32_t d = 0; d < arg.ndim; ++d) {
            arg.sizes[d] = tensor.size(d);
            arg.strides[d] = tensor.stride(d);
        }
        return true;
    }
    if (PyBool_Check(object)) {
        arg.kind = CUDA_AGENT_INT;
        arg.i = object == Py_True;
        return true;
    }
    if (PyLong_Check(object)) {
        arg.kind = CUDA_AGENT_INT;
        arg.i = PyLong_AsLongLong(object);
        if (arg.i == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError, "%s: argument %zd: an int beyond the 64-bit range", name, index);
            return false;
        }
        return true;
    }
    if (PyFloat_Check(object)) {
        arg.kind = CUDA_AGENT_FLOAT;
        arg.f = PyFloat_AS_DOUBLE(object);
        return true;
    }
    PyErr_Format(PyExc_TypeError, "%s: argument %zd: a tensor, int, float or bool, not %s", name, index,
                 Py_TYPE(object)->tp_name);
    return false;
}

PyObject* call_launcher(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    const auto* entry = static_cast<const cuda_agent_launcher_entry*>(PyCapsule_GetPointer(self, kCapsule));
    if (entry == nullptr) {
        return nullptr;
    }
    if (nargs > CUDA_AGENT_MAX_ARGS) {
        return PyErr_Format(PyExc_TypeError, "%s: at most %d arguments, got %zd", entry->name, CUDA_AGENT_MAX_ARGS,
                            nargs);
    }
    try {
        cuda_agent_arg described[CUDA_AGENT_MAX_ARGS];
        std::optional<c10::Device> device;
        for (Py_ssize_t i = 0; i < nargs; ++i) {
            if (!describe(entry->name, i, args[i], described[i], device)) {
                return nullptr;
            }
        }
        Outputs outputs{device.value_or(c10::Device(c10::kCPU))};
        cuda_agent_call call{described, static_cast<int32_t>(nargs), -1, nullptr, allocate, &outputs, {0}};
#ifdef CUDA_AGENT_SHIM_CUDA
        std::optional<c10::cuda::CUDAGuard> guard;
        if (device && device->is_cuda()) {
            guard.emplace(*device);
            call.device = device->index();
            call.stream = c10::cuda::getCurrentCUDAStream(device->index()).stream();
        }
#else
        if (device && !device->is_cpu()) {
            return PyErr_Format(PyExc_ValueError, "%s: tensors on %s, but this extension was built for the CPU",
                                entry->name, device->str().c_str());
        }
#endif
        if (entry->launch(&call) != 0) {
            call.error[sizeof call.error - 1] = '\0';
            return PyErr_Format(PyExc_RuntimeError, "%s: %s", entry->name,
                                call.error[0] ? call.error : "failed (the launcher gave no reason)");
        }
        return returned(outputs);
    } catch (const std::exception& error) {
        return PyErr_Format(PyExc_RuntimeError, "%s: %s", entry->name, error.what());
    }
}

PyModuleDef module_definition = {PyModuleDef_HEAD_INIT, "cuda_extension",
                                 "Launchers of kernels/ (cuda-agent's fast workdir contract)", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_cuda_extension() {
    PyObject* module = PyModule_Create(&module_definition);
    if (module == nullptr) {
        return nullptr;
    }
    // Method definitions must outlive the module: made once, never freed (one module per process).
    auto* methods = new PyMethodDef[cuda_agent_launcher_count];
    for (int i = 0; i < cuda_agent_launcher_count; ++i) {
        const cuda_agent_launcher_entry& entry = cuda_agent_launchers[i];
        methods[i] = {entry.name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_launcher)),
                      METH_FASTCALL, "A launcher of kernels/ (cuda_agent_launcher.h)"};
        PyObject* capsule = PyCapsule_New(const_cast<cuda_agent_launcher_entry*>(&entry), kCapsule, nullptr);
        PyObject* function = capsule ? PyCFunction_NewEx(&methods[i], capsule, nullptr) : nullptr;
        Py_XDECREF(capsule);
        if (function == nullptr || PyModule_AddObject(module, entry.name, function) != 0) {
            Py_XDECREF(function);
            Py_DECREF(module);
            return nullptr;
        }
    }
    return module;
}

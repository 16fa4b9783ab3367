/* cuda-agent's launcher interface: the fast workdir contract (docs/environment.md).
 *
 * kernels/*.cu and kernels/*.cpp include this header (as <cuda_agent_launcher.h>; the harness
 * provides it, a workdir's own copy is never compiled) and CUDA's or the C++ standard headers,
 * nothing of torch. Every function they export with C linkage is a launcher:
 *
 *     extern "C" int NAME(cuda_agent_call* call);   // 0: done; else why in call->error
 *
 * model_new.py calls it as cuda_extension.NAME(arg0, arg1, ...) with tensors, ints, floats and
 * bools; the harness's pre-built shim describes them in call->args, in order, and passes the
 * current CUDA stream of the tensors' device. A launcher makes its outputs with
 * cuda_agent_output (new tensors on that device, returned to Python in order: none -> None, one ->
 * the tensor, more -> a tuple), or writes into tensors it was passed.
 */
#ifndef CUDA_AGENT_LAUNCHER_H
#define CUDA_AGENT_LAUNCHER_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define CUDA_AGENT_MAX_DIMS 8
#define CUDA_AGENT_MAX_ARGS 64
#define CUDA_AGENT_MAX_OUTPUTS 8

enum cuda_agent_kind { CUDA_AGENT_TENSOR = 0, CUDA_AGENT_INT = 1, CUDA_AGENT_FLOAT = 2 };

enum cuda_agent_dtype {
    CUDA_AGENT_FLOAT32 = 0, CUDA_AGENT_FLOAT64 = 1, CUDA_AGENT_FLOAT16 = 2, CUDA_AGENT_BFLOAT16 = 3,
    CUDA_AGENT_INT64 = 4, CUDA_AGENT_INT32 = 5, CUDA_AGENT_INT16 = 6, CUDA_AGENT_INT8 = 7,
    CUDA_AGENT_UINT8 = 8, CUDA_AGENT_BOOL = 9
};

typedef struct cuda_agent_arg {
    int32_t kind;                          /* cuda_agent_kind */
    int32_t dtype;                         /* tensors: cuda_agent_dtype */
    int32_t ndim;                          /* tensors */
    int32_t reserved;
    void* data;                            /* tensors: address of element 0 (storage offset applied) */
    int64_t numel;                         /* tensors */
    int64_t sizes[CUDA_AGENT_MAX_DIMS];    /* tensors */
    int64_t strides[CUDA_AGENT_MAX_DIMS];  /* tensors, in elements */
    int64_t i;                             /* ints; bools as 0 or 1 */
    double f;                              /* floats */
} cuda_agent_arg;

typedef struct cuda_agent_call {
    const cuda_agent_arg* args;
    int32_t nargs;
    int32_t device;  /* the tensors' CUDA device, or -1 (CPU tensors, or none) */
    void* stream;    /* that device's current cudaStream_t; NULL on the CPU */
    /* The shim's allocator behind cuda_agent_output, and its state. */
    int (*allocate)(struct cuda_agent_call* call, int32_t dtype, int32_t ndim, const int64_t* sizes, void** data);
    void* shim;
    char error[512]; /* a launcher that returns non-zero says why here */
} cuda_agent_call;

typedef int (*cuda_agent_launcher)(cuda_agent_call* call);

typedef struct cuda_agent_launcher_entry {
    const char* name;
    cuda_agent_launcher launch;
} cuda_agent_launcher_entry;

/* Writes the message (printf format) into call->error; returns 1, so `return cuda_agent_fail(...)`. */
static inline int cuda_agent_fail(cuda_agent_call* call, const char* format, ...) {
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(call->error, sizeof call->error, format, arguments);
    va_end(arguments);
    return 1;
}

/* Non-zero (message set) unless the call has exactly `count` arguments. */
static inline int cuda_agent_expect_args(cuda_agent_call* call, int32_t count) {
    return call->nargs == count ? 0 : cuda_agent_fail(call, "expected %d arguments, got %d", count, call->nargs);
}

/* Non-zero (message set) unless argument `index` is a contiguous (row-major) tensor of `dtype`. */
static inline int cuda_agent_expect_tensor(cuda_agent_call* call, int32_t index, int32_t dtype) {
    const cuda_agent_arg* a = &call->args[index];
    if (a->kind != CUDA_AGENT_TENSOR || a->dtype != dtype) {
        return cuda_agent_fail(call, "argument %d: expected a tensor of dtype code %d", index, dtype);
    }
    int64_t expected = 1;
    for (int32_t d = a->ndim - 1; d >= 0; --d) {
        if (a->sizes[d] != 1 && a->strides[d] != expected) {
            return cuda_agent_fail(call, "argument %d: expected a contiguous tensor (call .contiguous())", index);
        }
        expected *= a->sizes[d];
    }
    return 0;
}

/* A new (uninitialised, contiguous) output tensor of `dtype` and `sizes` on the arguments' device,
 * returned to the caller after the launcher succeeds; its data in *data. Non-zero (message set)
 * when it cannot be made (more than CUDA_AGENT_MAX_OUTPUTS, a bad dtype or shape, out of memory). */
static inline int cuda_agent_output(cuda_agent_call* call, int32_t dtype, int32_t ndim, const int64_t* sizes,
                                    void** data) {
    return call->allocate(call, dtype, ndim, sizes, data);
}

#ifdef __CUDACC__
/* The stream to launch on, and the launch's error (if any) as the launcher's result. */
#define cuda_agent_stream(call) ((cudaStream_t)(call)->stream)
static inline int cuda_agent_launch_status(cuda_agent_call* call) {
    const cudaError_t error = cudaGetLastError();
    return error == cudaSuccess ? 0 : cuda_agent_fail(call, "kernel launch failed: %s", cudaGetErrorString(error));
}
#endif

#endif /* CUDA_AGENT_LAUNCHER_H */

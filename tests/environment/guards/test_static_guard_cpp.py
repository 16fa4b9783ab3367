"""C++/CUDA static guards: each cheat in kernels/k.cu is caught with its code, each near miss passes.

Every case starts with a comment that explains the trick (or why the near miss is honest). The
sources are scanned as tokens, never compiled.
"""

from __future__ import annotations

import textwrap

import pytest

from cuda_agent.environment.guards import GuardConfig

HEAD = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void k(const float* x, float* out, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""


def kernel(body: str) -> str:
    return HEAD + textwrap.dedent(body)


CHEATS = {
    "aten-compute-fallback": [
        ("at_matmul", """
        // The "kernel" is ATen's GEMM.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return at::matmul(x, y); }
        """),
        ("torch_mm_and_native", """
        // torch:: and at::native:: spell the same fallback.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto a = torch::mm(x, y);
            return at::native::relu(a);
        }
        """),
        ("tensor_method", """
        // A reduction as a tensor method on a local tensor.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto xc = x.contiguous();
            return xc.sum(-1);
        }
        """),
        ("operator_overload", """
        // Tensor operators are ATen kernels.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x * 2 + y; }
        """),
        ("using_namespace", """
        // Unqualified through a using-directive (or argument-dependent lookup).
        using namespace at;
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return softmax(x, 1); }
        """),
        ("function_reference", """
        // Binds an ATen op directly, never writing a call.
        auto op = &at::relu;
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return op(x); }
        """),
        ("functional_namespace_alias", """
        // A namespace alias for torch::nn::functional.
        namespace Fn = torch::nn::functional;
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return Fn::gelu(x); }
        """),
        ("spliced_name", """
        // A backslash-newline splits the name; the compiler joins it again.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return at::mat\\
        mul(x, y); }
        """),
    ],
    "stream-creation": [
        ("stream_create", """
        // A private stream: the launch escapes the timed region.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            cudaStream_t s;
            cudaStreamCreate(&s);
            auto out = torch::empty_like(x);
            k<<<1, 256, 0, s>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
            return out;
        }
        """),
        ("pool_stream", """
        // A stream from ATen's pool.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto s = at::cuda::getStreamFromPool();
            return x;
        }
        """),
        ("launcher_on_per_thread_stream", """
        // A launcher of the fast contract, on a stream other than the one the shim passes it.
        extern "C" int f(cuda_agent_call* call) {
            k<<<1, 256, 0, cudaStreamPerThread>>>((const float*)call->args[0].data, nullptr, call->args[0].numel);
            return 0;
        }
        """),
        ("per_thread_stream", """
        // The per-thread default stream is not the harness's current stream.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto out = torch::empty_like(x);
            k<<<1, 256, 0, cudaStreamPerThread>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
            return out;
        }
        """),
    ],
    "library-call": [
        ("cufft", """
        // cuFFT is not an allowed library.
        #include <cufft.h>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            cufftHandle plan;
            cufftPlan1d(&plan, 8, CUFFT_C2C, 1);
            return x;
        }
        """),
        ("curand", """
        // cuRAND generates what the task should compute.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            curandGenerator_t gen;
            curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT);
            return x;
        }
        """),
    ],
    "token-pasting": [
        ("paste", """
        // ## builds an identifier no token names.
        #define CAT(a, b) a##b
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return at::CAT(mat, mul)(x, y); }
        """),
        ("rename", """
        // A macro renames the forbidden op.
        #define MM at::matmul
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return MM(x, y); }
        """),
        ("constructor", """
        // Runs when the library is loaded, before any check.
        __attribute__((constructor)) static void init() {}
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
        """),
        ("asm_syscall", """
        // A raw system call.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            asm volatile("syscall");
            return x;
        }
        """),
        ("digraph_paste", """
        // %:%: is ## spelled as a digraph.
        %:define CAT(a, b) a %:%: b
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
        """),
    ],
    "monkeypatch": [
        ("override_aten_kernel", """
        // Registers its own CUDA kernel for aten::mm: every torch.mm in the process now runs it.
        torch::Tensor mymm(const torch::Tensor& a, const torch::Tensor& b) { return a; }
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
        TORCH_LIBRARY_IMPL(aten, CUDA, m) { m.impl("mm", &mymm); }
        """),
        ("fragment_of_aten", """
        // Adds definitions to PyTorch's own operator namespace.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
        TORCH_LIBRARY_FRAGMENT(aten, m) { m.def("my_op(Tensor x) -> Tensor"); }
        """),
    ],
    "concurrency": [
        ("std_thread", """
        // Work on a host thread outside the timed region.
        #include <thread>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            std::thread t([] {});
            t.detach();
            return x;
        }
        """),
        ("system_by_pointer", """
        // system is never called by name: its address is taken and called later.
        #include <cstdlib>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto run = &system;
            run("true");
            return x;
        }
        """),
        ("system_by_pointer_beside_a_shadowing_variable", """
        // A variable named system shadows the function only in its own function, not in f.
        #include <cstdlib>
        __device__ bool keep(bool system) { return system; }
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto run = &system;
            run("true");
            return x;
        }
        """),
        ("fork_system", """
        // Processes from the extension.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            if (fork() == 0) { system("true"); }
            return x;
        }
        """),
        ("thread_after_using_namespace_std", """
        // `thread` without the std:: prefix names std::thread all the same.
        #include <thread>
        using namespace std;
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            static thread* pending = nullptr;
            pending = new thread([] {});
            return x;
        }
        """),
        ("async_after_using_namespace_std", """
        // std::async spelled async: the work runs on a thread the call does not wait for.
        #include <future>
        using namespace std;
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto done = async(launch::async, [] { return 0; });
            return x;
        }
        """),
        ("timer_create_thread", """
        // A POSIX timer with SIGEV_THREAD makes libc start the thread: no thread API is named.
        #include <ctime>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            struct sigevent event {};
            event.sigev_notify = SIGEV_THREAD;
            timer_t timer;
            timer_create(CLOCK_MONOTONIC, &event, &timer);
            return x;
        }
        """),
        ("signal_handler", """
        // A signal handler runs outside the call that installed it.
        #include <csignal>
        static void later(int) {}
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            struct sigaction action {};
            sigaction(SIGALRM, &action, nullptr);
            std::signal(SIGUSR1, later);
            return x;
        }
        """),
    ],
    "file-or-network": [
        ("fopen", """
        // Reads answers from (or leaves them in) a file.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            FILE* fp = fopen("/tmp/answers.bin", "rb");
            return x;
        }
        """),
        ("ofstream", """
        // C++ streams to files.
        #include <fstream>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            std::ofstream out("/tmp/log");
            return x;
        }
        """),
        ("socket", """
        // Network access.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            int fd = socket(2, 1, 0);
            return x;
        }
        """),
        ("std_qualified_c_file_calls", """
        // The <cstdio> spellings of the C file functions.
        #include <cstdio>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            std::FILE* fp = std::fopen("../io/inputs_0.bin", "wb");
            std::rename("a", "b");
            return x;
        }
        """),
        ("write_and_dup2_on_an_inherited_fd", """
        // Forges a reply on a pipe the process inherited, then diverts the genuine one.
        #include <unistd.h>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            (void)::write(3, "{}\\n", 3);
            const int saved = dup(3);
            dup2(2, 3);
            return x;
        }
        """),
        ("raw_syscall", """
        // open(2) spelled as a raw system call.
        #include <sys/syscall.h>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            long fd = syscall(SYS_openat, AT_FDCWD, "../io/inputs_0.bin", 01);
            return x;
        }
        """),
    ],
    "dynamic-code": [
        ("dlopen", """
        // Loads a prebuilt library the guards never read.
        #include <dlfcn.h>
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            void* h = dlopen("libcheat.so", RTLD_NOW);
            return x;
        }
        """),
        ("nvrtc", """
        // Compiles kernel source from a string at run time.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            nvrtcProgram prog;
            nvrtcCreateProgram(&prog, "", "k.cu", 0, nullptr, nullptr);
            return x;
        }
        """),
    ],
    "python-from-cpp": [
        ("pybind_import", """
        // Calls back into Python's torch from C++.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            auto torch_mod = pybind11::module_::import("torch");
            return x;
        }
        """),
        ("pybind_attr_call", """
        // The tensor's own (ATen) relu, reached as a Python attribute: no ATen name in the C++.
        namespace py = pybind11;
        py::object f(py::object x, torch::Tensor y) { return x.attr("relu")(); }
        """),
        ("cpython_api", """
        // The CPython API runs Python code directly.
        torch::Tensor f(torch::Tensor x, torch::Tensor y) {
            PyRun_SimpleString("import torch");
            PyObject_CallObject(nullptr, nullptr);
            return x;
        }
        """),
    ],
    "unverifiable-source": [
        ("parent_include", """
        // A header outside the solution.
        #include "../../secret.h"
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
        """),
        ("missing_include", """
        // A quoted header that is not part of the solution.
        #include "precomputed.h"
        torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
        """),
    ],
}

NEAR_MISSES = [
    ("honest_host_code", """
    // Metadata, allocation, checks and a launch on the current stream: all allowed.
    // A comment that mentions at::matmul or cudaStreamCreate is not code.
    #include <algorithm>
    #define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")
    #define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
    torch::Tensor f(torch::Tensor x, torch::Tensor y) {
        CHECK_CUDA(x);
        TORCH_CHECK(x.dim() == 2 && x.size(0) == y.size(0) && x.sizes() == y.sizes(), "shapes differ");
        TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "need contiguous fp32");
        TORCH_CHECK(at::cuda::getCurrentDeviceProperties()->major >= 7 && y.scalar_type() == at::ScalarType::Float,
                    "needs sm_70 and fp32");
        const char* msg = "at::matmul and cudaStreamCreate inside a string literal";
        const c10::cuda::CUDAGuard guard(x.device());
        auto xc = x.contiguous();
        auto out = torch::empty({x.size(0), x.size(1)}, x.options().dtype(torch::kFloat32));
        const int64_t n = xc.numel() * 2 / 2;
        const int blocks = static_cast<int>(std::min<int64_t>(CEIL_DIV(n, 256), 65535));
        cudaStream_t stream = at::cuda::getCurrentCUDAStream();
        k<<<blocks, 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), n);
        k<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), out.data_ptr<float>(), n);
        k<<<blocks, 256>>>(xc.data_ptr<float>() + 0, out.data_ptr<float>(), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return out.zero_();
    }
    """),
    ("device_math_and_std", """
    // Device-side math and std algorithms share names with ATen ops but are not ATen.
    #include <vector>
    __device__ float act(float a, float b) { return max(a, b) * expf(-abs(a)) + sqrtf(b); }
    template <typename T> void launch(const T* p, float* o, int64_t n, cudaStream_t stream) {
        k<<<1, 256, 0, stream>>>(p, o, n);
    }
    torch::Tensor f(torch::Tensor x, torch::Tensor y) {
        std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
        std::vector<int> v{3, 1, 2};
        std::sort(v.begin(), v.end());
        std::remove(v.begin(), v.end(), 1);
        int m = std::max(v[0], 1);
        fprintf(stderr, "launching %d\\n", m);
        auto out = at::empty_like(x);
        launch(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), at::cuda::getCurrentCUDAStream());
        return out;
    }
    """),
    ("names_shared_with_libc", """
    // Members, variables and algorithms that share a name with a C library function are not it.
    #include <algorithm>
    #include <functional>
    #include <vector>
    struct Sink {
        float buf[4];
        void write(int i, float v) { buf[i] = v; }
    };
    __device__ bool keep(bool write, float signal) { return write && signal > 0.f; }
    torch::Tensor f(torch::Tensor x, torch::Tensor y) {
        Sink sink;
        sink.write(0, 1.f);
        std::vector<int> v{3, 1, 2};
        v.erase(std::remove(v.begin(), v.end(), 1), v.end());
        auto plus_one = std::bind(std::plus<int>(), std::placeholders::_1, 1);
        const bool write = plus_one(v[0]) > 2;
        auto out = torch::empty_like(x);
        k<<<1, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
        return write ? out : out.zero_();
    }
    """),
    ("using_namespace_std_without_threads", """
    // using namespace std is fine; a variable named thread is not std::thread.
    #include <vector>
    using namespace std;
    __global__ void scale(float* o, int n) {
        const int thread = blockIdx.x * blockDim.x + threadIdx.x;
        if (thread < n) o[thread] *= 2.f;
    }
    torch::Tensor f(torch::Tensor x, torch::Tensor y) {
        vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
        const int64_t n = max<int64_t>(sizes[0], 1);
        scale<<<1, 256>>>(x.data_ptr<float>(), static_cast<int>(n));
        return x;
    }
    """),
    ("pybind_binding_code", """
    // Binding the kernel and exporting a constant are not calls into Python.
    torch::Tensor g(torch::Tensor x, torch::Tensor y) { return torch::empty_like(x); }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
        m.def("g", &g, "the kernel");
        m.attr("BLOCK") = 256;
    }
    """),
    ("own_operator_library", """
    // An operator library of the solution's own, with its CUDA implementation.
    torch::Tensor f(torch::Tensor x, torch::Tensor y) { return torch::empty_like(x); }
    TORCH_LIBRARY(mykernels, m) { m.def("f(Tensor x, Tensor y) -> Tensor"); }
    TORCH_LIBRARY_IMPL(mykernels, CUDA, m) { m.impl("f", &f); }
    """),
    ("cublas_and_ptx", """
    // cuBLAS is allowed by default; PTX inline assembly without system calls is compute.
    #include <cublas_v2.h>
    __device__ unsigned lane() { unsigned id; asm volatile("mov.u32 %0, %%laneid;" : "=r"(id)); return id; }
    torch::Tensor f(torch::Tensor x, torch::Tensor y) {
        cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
        cublasSetStream(handle, at::cuda::getCurrentCUDAStream());
        auto out = torch::empty({x.size(0), y.size(1)}, x.options());
        const float one = 1.f, zero = 0.f;
        cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)y.size(1), (int)x.size(0), (int)x.size(1), &one,
                    y.data_ptr<float>(), (int)y.size(1), x.data_ptr<float>(), (int)x.size(1), &zero,
                    out.data_ptr<float>(), (int)y.size(1));
        return out;
    }
    """),
]


@pytest.mark.parametrize(
    ("code", "source"),
    [pytest.param(code, source, id=f"{code}-{name}") for code, cases in CHEATS.items() for name, source in cases],
)
def test_cpp_cheat_is_caught(run_guards_on, code: str, source: str) -> None:
    violations = run_guards_on(kernel=kernel(source))
    assert code in {v.code for v in violations}, [f"{v.code}: {v.message}" for v in violations]
    assert all(v.message.startswith("kernels/k.cu:") for v in violations), [v.message for v in violations]


@pytest.mark.parametrize(("name", "source"), NEAR_MISSES, ids=[name for name, _ in NEAR_MISSES])
def test_cpp_near_miss_is_clean(run_guards_on, name: str, source: str) -> None:
    violations = run_guards_on(kernel=kernel(source))
    assert violations == [], [f"{v.code}: {v.message}" for v in violations]


def test_every_cpp_code_has_two_cheats() -> None:
    assert all(len(cases) >= 2 for cases in CHEATS.values())


def test_cpp_message_points_at_the_line(run_guards_on) -> None:
    [violation] = run_guards_on(kernel=kernel(CHEATS["aten-compute-fallback"][0][1]))
    line = 1 + kernel(CHEATS["aten-compute-fallback"][0][1]).splitlines().index(
        "torch::Tensor f(torch::Tensor x, torch::Tensor y) { return at::matmul(x, y); }")
    assert violation.message.startswith(f"kernels/k.cu:{line}: calls at::matmul")


def test_library_call_follows_allowed_libraries(run_guards_on) -> None:
    source = kernel(dict(NEAR_MISSES)["cublas_and_ptx"])
    assert run_guards_on(kernel=source) == []
    violations = run_guards_on(kernel=source, config=GuardConfig(allowed_libraries=("cudnn",)))
    assert {v.code for v in violations} == {"library-call"}
    assert run_guards_on(kernel=kernel(CHEATS["library-call"][0][1]),
                         config=GuardConfig(allowed_libraries=("cufft",))) == []


def test_allow_streams_permits_stream_apis(run_guards_on) -> None:
    source = kernel(CHEATS["stream-creation"][0][1])
    assert run_guards_on(kernel=source, config=GuardConfig(allow_streams=True)) == []


def test_a_launcher_may_launch_on_the_stream_the_shim_passes(run_guards_on) -> None:
    source = kernel("""
    extern "C" int f(cuda_agent_call* call) {
        cudaStream_t stream = cuda_agent_stream(call);
        k<<<1, 256, 0, cuda_agent_stream(call)>>>((const float*)call->args[0].data, nullptr, call->args[0].numel);
        k<<<1, 256, 0, stream>>>((const float*)call->args[0].data, nullptr, call->args[0].numel);
        return 0;
    }
    """)
    assert run_guards_on(kernel=source) == []


def test_quoted_include_of_a_solution_header_is_fine(run_guards_on) -> None:
    source = kernel("""
    #include "common.cuh"
    torch::Tensor f(torch::Tensor x, torch::Tensor y) { return x; }
    """)
    assert run_guards_on(kernel=source, files={"kernels/common.cuh": "#pragma once\n"}) == []


EMBEDDED = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

HEADER = "#include <torch/extension.h>\\n"
BODY = """
torch::Tensor f(torch::Tensor x) {{
    return {expr};
}}
"""
_ext = load_inline(name="k", cpp_sources=[HEADER + BODY], functions=["f"], extra_cflags=[{flags}])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.f(x)
'''


def test_load_inline_sources_are_scanned_through_names_lists_and_concatenation(run_guards_on) -> None:
    assert run_guards_on(python=EMBEDDED.format(expr="torch::empty_like(x)", flags='"-O3"')) == []
    [violation] = run_guards_on(python=EMBEDDED.format(expr="at::relu(x)", flags='"-O3"'))
    assert violation.code == "aten-compute-fallback"
    assert violation.message.startswith("solution.py:9: calls at::relu"), violation.message


def test_define_flags_are_scanned_as_macros(run_guards_on) -> None:
    violations = run_guards_on(python=EMBEDDED.format(expr="MM(x, x)", flags='"-DMM=at::matmul"'))
    assert {v.code for v in violations} == {"token-pasting"}

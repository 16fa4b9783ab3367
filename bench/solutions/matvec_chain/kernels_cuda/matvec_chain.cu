// y = A (B v) on CUDA: u = B v, then y = A u, one block per row (grid-stride over rows), each
// thread summing a strided part of its row in fp32, then a warp-shuffle and shared-memory
// reduction. Arguments: A, B (n x n), v (n), work (>= 1): the first product computes work * n
// rows, row r into u[r % n], so rows past n write the values already there (the bench's knob for
// a slower kernel). Outputs: y, then the scratch u.
#include <cuda_runtime.h>
#include <cuda_agent_launcher.h>

#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Sum of v over the whole block, returned to every thread. smem holds >= 32 floats; blockDim.x
// is a multiple of 32.
__device__ float block_sum(float v, float* smem) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // smem may still be read from the previous row
    if (lane == 0) {
        smem[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < num_warps ? smem[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) {
            smem[0] = v;
        }
    }
    __syncthreads();
    return smem[0];
}

// out[r % n] = dot(m[r % n, :], x) for r in [0, rows).
__global__ void matvec_rows(const float* __restrict__ m, const float* __restrict__ x, float* __restrict__ out,
                            int64_t n, int64_t rows) {
    __shared__ float smem[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t i = r % n;
        const float* row = m + i * n;
        float acc = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            acc += row[j] * x[j];
        }
        acc = block_sum(acc, smem);
        if (threadIdx.x == 0) {
            out[i] = acc;
        }
    }
}

static int blocks_for(int64_t rows) {
    return static_cast<int>(std::min<int64_t>(rows, 65535));
}

extern "C" int matvec_chain(cuda_agent_call* call) {
    if (cuda_agent_expect_args(call, 4) || cuda_agent_expect_tensor(call, 0, CUDA_AGENT_FLOAT32) ||
        cuda_agent_expect_tensor(call, 1, CUDA_AGENT_FLOAT32) || cuda_agent_expect_tensor(call, 2, CUDA_AGENT_FLOAT32)) {
        return 1;
    }
    if (call->device < 0) {
        return cuda_agent_fail(call, "A, B and v must be CUDA tensors");
    }
    const cuda_agent_arg& a = call->args[0];
    const cuda_agent_arg& b = call->args[1];
    const cuda_agent_arg& v = call->args[2];
    const int64_t n = v.numel;
    if (a.ndim != 2 || b.ndim != 2 || v.ndim != 1 || a.sizes[0] != n || a.sizes[1] != n || b.sizes[0] != n ||
        b.sizes[1] != n) {
        return cuda_agent_fail(call, "expected A, B of shape (n, n) and v of shape (n)");
    }
    if (call->args[3].kind != CUDA_AGENT_FLOAT || !(call->args[3].f >= 1.0)) {
        return cuda_agent_fail(call, "argument 3: expected a float work factor >= 1");
    }
    float* y = nullptr;
    float* u = nullptr;
    if (cuda_agent_output(call, CUDA_AGENT_FLOAT32, 1, &n, reinterpret_cast<void**>(&y)) ||
        cuda_agent_output(call, CUDA_AGENT_FLOAT32, 1, &n, reinterpret_cast<void**>(&u))) {
        return 1;
    }
    if (n == 0) {
        return 0;
    }
    const float* pa = static_cast<const float*>(a.data);
    const float* pb = static_cast<const float*>(b.data);
    const float* pv = static_cast<const float*>(v.data);
    const int64_t rows = static_cast<int64_t>(call->args[3].f * static_cast<double>(n));
    constexpr int kThreads = 256;
    const cudaStream_t stream = cuda_agent_stream(call);
    matvec_rows<<<blocks_for(rows), kThreads, 0, stream>>>(pb, pv, u, n, rows);
    matvec_rows<<<blocks_for(n), kThreads, 0, stream>>>(pa, u, y, n, n);
    return cuda_agent_launch_status(call);
}

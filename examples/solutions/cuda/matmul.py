"""CUDA reference solution for tasks/matmul.py: shared-memory tiled SGEMM with 4x4 register blocking.

Each 256-thread block computes a 64x64 tile of C, stepping over K in slices of 16 that are staged
in shared memory; each thread accumulates a 4x4 sub-tile in registers (fp32 FMA, no TF32).
Out-of-range rows/columns are zero-filled on load and masked on store, so any M, N, K works.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor matmul_forward(torch::Tensor a, torch::Tensor b);"

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <climits>

constexpr int BM = 64;   // rows of C per block
constexpr int BN = 64;   // columns of C per block
constexpr int BK = 16;   // K slice staged in shared memory
constexpr int TDIM = 16; // threads per block: TDIM x TDIM
constexpr int TM = BM / TDIM;  // 4 rows per thread
constexpr int TN = BN / TDIM;  // 4 columns per thread
constexpr int NTHREADS = TDIM * TDIM;

__global__ void __launch_bounds__(NTHREADS)
matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
              int M, int N, int K) {
    // A is stored transposed (k-major) so the compute loop reads a column of the A tile contiguously;
    // +1 padding spreads the transposing stores over more banks.
    __shared__ float As[BK][BM + 1];
    __shared__ float Bs[BK][BN];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int tid = ty * TDIM + tx;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            acc[i][j] = 0.0f;
        }
    }

    for (int k0 = 0; k0 < K; k0 += BK) {
        // A tile (BM x BK): 16 consecutive threads read 16 consecutive floats of one row of A.
#pragma unroll
        for (int l = 0; l < (BM * BK) / NTHREADS; ++l) {
            const int e = tid + l * NTHREADS;
            const int r = e / BK;
            const int c = e % BK;
            const int gr = row0 + r;
            const int gc = k0 + c;
            As[c][r] = (gr < M && gc < K) ? A[static_cast<int64_t>(gr) * K + gc] : 0.0f;
        }
        // B tile (BK x BN): 64 consecutive threads read one row segment of B.
#pragma unroll
        for (int l = 0; l < (BK * BN) / NTHREADS; ++l) {
            const int e = tid + l * NTHREADS;
            const int r = e / BN;
            const int c = e % BN;
            const int gr = k0 + r;
            const int gc = col0 + c;
            Bs[r][c] = (gr < K && gc < N) ? B[static_cast<int64_t>(gr) * N + gc] : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM];
            float b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                a[i] = As[kk][ty + i * TDIM];
            }
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                b[j] = Bs[kk][tx + j * TDIM];
            }
#pragma unroll
            for (int i = 0; i < TM; ++i) {
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                }
            }
        }
        __syncthreads();
    }

    // Thread (tx, ty) owns rows ty + i*16 and columns tx + j*16: stores are coalesced along tx.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + ty + i * TDIM;
        if (r >= M) {
            continue;
        }
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int c = col0 + tx + j * TDIM;
            if (c < N) {
                C[static_cast<int64_t>(r) * N + c] = acc[i][j];
            }
        }
    }
}

torch::Tensor matmul_forward(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "matmul_forward: inputs must be CUDA tensors");
    TORCH_CHECK(a.device() == b.device(), "matmul_forward: inputs must be on the same device");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32,
                "matmul_forward: inputs must be float32");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "matmul_forward: inputs must be 2D");
    TORCH_CHECK(a.size(1) == b.size(0), "matmul_forward: inner dimensions differ");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "matmul_forward: inputs must be contiguous");
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    TORCH_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, "matmul_forward: dimensions too large");
    TORCH_CHECK((M + BM - 1) / BM <= 65535, "matmul_forward: too many rows for the grid");
    const c10::cuda::CUDAGuard device_guard(a.device());

    torch::Tensor c = torch::empty({M, N}, a.options());
    if (M == 0 || N == 0) {
        return c;
    }
    const dim3 block(TDIM, TDIM);
    const dim3 grid(static_cast<unsigned>((N + BN - 1) / BN), static_cast<unsigned>((M + BM - 1) / BM));
    matmul_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
        static_cast<int>(M), static_cast<int>(N), static_cast<int>(K));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

_ext = load_inline(
    name="cuda_agent_example_cuda_matmul",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["matmul_forward"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return _ext.matmul_forward(A.contiguous(), B.contiguous())

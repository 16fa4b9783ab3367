// ReLU on CUDA: grid-stride elementwise kernel, float4 body when both buffers are 16-byte aligned.
#include <torch/types.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float relu1(float v) {
    return v < 0.0f ? 0.0f : v;  // NaN compares false, so it passes through like torch.relu
}

template <bool kVec>
__global__ void relu_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (kVec) {
        const int64_t n4 = n / 4;
        const float4* in4 = reinterpret_cast<const float4*>(in);
        float4* out4 = reinterpret_cast<float4*>(out);
        for (int64_t i = tid; i < n4; i += stride) {
            float4 v = in4[i];
            v.x = relu1(v.x);
            v.y = relu1(v.y);
            v.z = relu1(v.z);
            v.w = relu1(v.w);
            out4[i] = v;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + tid; i < n; i += stride) {
        out[i] = relu1(in[i]);
    }
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "relu_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "relu_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "relu_forward: x must be contiguous");
    const c10::cuda::CUDAGuard device_guard(x.device());

    torch::Tensor out = torch::empty(x.sizes(), x.options());
    const int64_t n = x.numel();
    if (n == 0) {
        return out;
    }
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const bool vec = (reinterpret_cast<std::uintptr_t>(in) % 16 == 0) &&
                     (reinterpret_cast<std::uintptr_t>(o) % 16 == 0);

    constexpr int kThreads = 256;
    const int64_t work = vec ? std::max<int64_t>(n / 4, 1) : n;
    const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 16;
    const int blocks = static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, max_blocks));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        relu_kernel<true><<<blocks, kThreads, 0, stream>>>(in, o, n);
    } else {
        relu_kernel<false><<<blocks, kThreads, 0, stream>>>(in, o, n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// ReLU on CPU: one pass over the contiguous fp32 buffer. The fast contract: no torch header, one
// launcher, which makes its output through the harness's shim; model_new.py calls
// cuda_extension.relu_forward(x) and gets the output back.
#include <cuda_agent_launcher.h>

#include <cstdint>

extern "C" int relu_forward(cuda_agent_call* call) {
    if (cuda_agent_expect_args(call, 1) || cuda_agent_expect_tensor(call, 0, CUDA_AGENT_FLOAT32)) {
        return 1;
    }
    const cuda_agent_arg& x = call->args[0];
    float* o = nullptr;
    if (cuda_agent_output(call, CUDA_AGENT_FLOAT32, x.ndim, x.sizes, reinterpret_cast<void**>(&o))) {
        return 1;
    }
    const float* in = static_cast<const float*>(x.data);
    for (int64_t i = 0; i < x.numel; ++i) {
        const float v = in[i];
        o[i] = v < 0.0f ? 0.0f : v;  // NaN compares false, so it passes through like torch.relu
    }
    return 0;
}

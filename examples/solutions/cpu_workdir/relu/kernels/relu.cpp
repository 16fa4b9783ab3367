// ReLU on CPU: one pass over the contiguous fp32 buffer. The fast contract: no torch header, one
// launcher; model_new.py allocates the output and calls cuda_extension.relu_forward(x, out).
#include <cuda_agent_launcher.h>

#include <cstdint>

extern "C" int relu_forward(cuda_agent_call* call) {
    if (cuda_agent_expect_args(call, 2) || cuda_agent_expect_tensor(call, 0, CUDA_AGENT_FLOAT32) ||
        cuda_agent_expect_tensor(call, 1, CUDA_AGENT_FLOAT32)) {
        return 1;
    }
    const cuda_agent_arg& x = call->args[0];
    const cuda_agent_arg& out = call->args[1];
    if (out.numel != x.numel) {
        return cuda_agent_fail(call, "out has %lld elements, x %lld", (long long)out.numel, (long long)x.numel);
    }
    const float* in = static_cast<const float*>(x.data);
    float* o = static_cast<float*>(out.data);
    for (int64_t i = 0; i < x.numel; ++i) {
        const float v = in[i];
        o[i] = v < 0.0f ? 0.0f : v;  // NaN compares false, so it passes through like torch.relu
    }
    return 0;
}

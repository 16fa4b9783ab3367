// y = A (B v) on the CPU: u = B v, then y = A u, each row a dot product over 8 independent fp32
// partial sums (rounding close to a blocked sum). Arguments: A, B (n x n), v (n), work (>= 1):
// the first product computes work * n rows, row r into u[r % n], so rows past n repeat the same
// values (the bench's knob for a slower kernel). Outputs: y, then the scratch u.
#include <cuda_agent_launcher.h>

#include <cstdint>

static float dot(const float* a, const float* x, int64_t n) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        for (int k = 0; k < 8; ++k) {
            acc[k] += a[j + k] * x[j + k];
        }
    }
    for (; j < n; ++j) {
        acc[j & 7] += a[j] * x[j];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

extern "C" int matvec_chain(cuda_agent_call* call) {
    if (cuda_agent_expect_args(call, 4) || cuda_agent_expect_tensor(call, 0, CUDA_AGENT_FLOAT32) ||
        cuda_agent_expect_tensor(call, 1, CUDA_AGENT_FLOAT32) || cuda_agent_expect_tensor(call, 2, CUDA_AGENT_FLOAT32)) {
        return 1;
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
    const float* pa = static_cast<const float*>(a.data);
    const float* pb = static_cast<const float*>(b.data);
    const float* pv = static_cast<const float*>(v.data);
    const int64_t rows = static_cast<int64_t>(call->args[3].f * static_cast<double>(n));
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r % n;
        u[i] = dot(pb + i * n, pv, n);
    }
    for (int64_t i = 0; i < n; ++i) {
        y[i] = dot(pa + i * n, u, n);
    }
    return 0;
}

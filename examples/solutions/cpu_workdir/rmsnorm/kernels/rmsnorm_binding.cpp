#include <torch/extension.h>

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps);

void register_rmsnorm(pybind11::module_& m) {
    m.def("rmsnorm_forward", &rmsnorm_forward, "RMSNorm over the last dim with a per-channel weight (CPU)");
}

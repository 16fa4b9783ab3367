#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x);

void register_relu(pybind11::module_& m) {
    m.def("relu_forward", &relu_forward, "ReLU of a contiguous fp32 tensor (CUDA)");
}

"""A corpus of honest single-file solutions in the ``load_inline`` call styles found in the wild.

Every entry computes ReLU (``tests/fixtures/tasks/small_relu.py``) with the same kernel; entries
differ only in how they call torch's JIT builder: KernelBench's few-shot style (``extra_cflags=[""]``,
``extra_ldflags=[""]``, ``verbose=True``), duplicate and padded flags, ``functions`` as a list, a
string or a dict, ``cpp_sources``/``cuda_sources`` as strings or lists, their own
``PYBIND11_MODULE``, positional arguments, aliased imports, a build inside ``__init__``, and the
rest of ``load_inline``'s keywords. One entry does not compile (both builders must say so). Two
CUDA-only entries keep torch out of ``cuda_sources`` (kernel and launcher there, tensor glue in
``cpp_sources``): one compiles after CUDA's headers alone (the light prelude), the other needs a
header torch's prelude brings (``<cstdio>``), so the lean path must retry it with torch's prelude.

The differential build test builds each entry with cuda-agent's lean path and with torch's own
builder and requires the same compile outcome and the same verdict.
"""

from __future__ import annotations

import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.environment import BuildConfig, EvalConfig, Prestarter, Verdict, load_solution, load_task
from cuda_agent.environment.build import build_location, build_many
from cuda_agent.environment.prebuilt import MANIFEST
from cuda_agent.environment.evaluator import evaluate

TASK = Path(__file__).resolve().parent / "fixtures" / "tasks" / "small_relu.py"
CI_ENTRIES = ("kernelbench_fewshot", "syntax_error")
"""What CI builds (a C++ build takes about a minute on its two cores, and each entry is built by
both builders): the call style that broke the lean path before, and the entry that must fail to
compile. The other argument styles run with ``CUDA_AGENT_BUILD_CORPUS=all`` (the GPU validation)."""

CPU_KERNEL = r"""
torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous(), "relu_forward: x must be contiguous");
    torch::Tensor out = torch::empty(x.sizes(), x.options());
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
        o[i] = in[i] < 0.0f ? 0.0f : in[i];
    }
    return out;
}
"""

RELU_CUDA_KERNEL = r"""
__global__ void relu_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = in[i];
        out[i] = v < 0.0f ? 0.0f : v;
    }
}
"""

CUDA_KERNEL = RELU_CUDA_KERNEL + r"""
torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous(), "relu_forward: x must be contiguous");
    torch::Tensor out = torch::empty(x.sizes(), x.options());
    const int64_t n = x.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    relu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

LIGHT_CUDA_KERNEL = RELU_CUDA_KERNEL + r"""
void relu_launch(const float* in, float* out, int64_t n) {
    const int threads = 256;
    relu_kernel<<<(n + threads - 1) / threads, threads>>>(in, out, n);%s
}
"""
LAUNCH_ERROR_REPORT = """
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) fprintf(stderr, "relu_launch: %s\\n", cudaGetErrorString(error));"""
LIGHT_GLUE = r"""
void relu_launch(const float* in, float* out, int64_t n);

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "relu_forward: x must be a contiguous CUDA tensor");
    torch::Tensor out = torch::empty(x.sizes(), x.options());
    relu_launch(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}
"""

DECLARATION = "torch::Tensor relu_forward(torch::Tensor x);"
SECOND_DECLARATION = "torch::Tensor relu_twice(torch::Tensor x);"
SECOND_FUNCTION = "\ntorch::Tensor relu_twice(torch::Tensor x) { return relu_forward(relu_forward(x)); }\n"
PYBIND = '\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("relu_forward", &relu_forward, "relu"); }\n'


@dataclass(frozen=True)
class Style:
    """One way of calling the builder. ``{K}`` in ``call`` stands for the kernel source variable,
    ``{D}`` for the declaration variable, ``{N}`` for the extension name."""

    name: str
    call: str
    builder_import: str = "from torch.utils.cpp_extension import load_inline"
    in_init: bool = False
    extra_source: str = ""
    compiles: bool = True
    cuda_sources: tuple[str, str] | None = None
    """CUDA only: ``(cuda_sources, cpp_sources)`` in place of the shared kernel and declaration."""
    cuda_prelude: str | None = None
    """The prelude the lean build's manifest must record for the CUDA unit (``light`` or ``torch``)."""

    @property
    def devices(self) -> tuple[str, ...]:
        return ("cuda",) if self.cuda_sources else ("cpu", "cuda")


_CPU = "cpp_sources={K}"
_CUDA = "cpp_sources={D}, cuda_sources={K}"

STYLES: tuple[Style, ...] = (
    Style("kernelbench_fewshot", 'load_inline(name="{N}", {S}, functions=["relu_forward"], verbose=True, '
                                 'extra_cflags=[""], extra_ldflags=[""])'),
    Style("empty_cuda_flags", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=[""], '
                              'extra_cuda_cflags=[""], extra_ldflags=[""])'),
    Style("duplicate_flags", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=["-O3", "-O3"], '
                             'extra_cuda_cflags=["-O3", "-O3"])'),
    Style("padded_flags", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=[" -O2 "], '
                          'extra_cuda_cflags=[" -O2 "])'),
    Style("no_flags", 'load_inline(name="{N}", {S}, functions=["relu_forward"])'),
    Style("flags_none", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=None, '
                        'extra_cuda_cflags=None, extra_ldflags=None)'),
    Style("ldflag_libm", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_ldflags=["-lm"])'),
    Style("empty_ldflags_list", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=["-O3"], '
                                'extra_ldflags=[])'),
    Style("samples_style", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=["-O3"], '
                           'extra_cuda_cflags=["-O3"], verbose=False)'),
    Style("fast_math", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=["-O3", "-fno-math-errno"], '
                       'extra_cuda_cflags=["-O3", "--use_fast_math"])'),
    Style("functions_string", 'load_inline(name="{N}", {S}, functions="relu_forward")'),
    Style("functions_dict", 'load_inline(name="{N}", {S}, functions={{"relu_forward": "ReLU, out of place"}})'),
    Style("own_pybind_module", 'load_inline(name="{N}", {S})', extra_source=PYBIND),
    Style("two_functions", 'load_inline(name="{N}", {S}, functions=["relu_forward", "relu_twice"])',
          extra_source=SECOND_FUNCTION),
    Style("cpp_sources_list", 'load_inline(name="{N}", cpp_sources=[{D_OR_K}], {CUDA_ONLY}functions=["relu_forward"])'),
    Style("sources_as_lists", 'load_inline(name="{N}", cpp_sources=[{D_OR_K}], {CUDA_LIST}functions=["relu_forward"], '
                              'extra_cflags=["-O3"])'),
    Style("verbose_true", 'load_inline(name="{N}", {S}, functions=["relu_forward"], verbose=True)'),
    Style("is_python_module", 'load_inline(name="{N}", {S}, functions=["relu_forward"], is_python_module=True)'),
    Style("no_error_handling", 'load_inline(name="{N}", {S}, functions=["relu_forward"], '
                               'with_pytorch_error_handling=False)'),
    Style("with_cuda_flag", 'load_inline(name="{N}", {S}, functions=["relu_forward"], with_cuda={WITH_CUDA})'),
    Style("keep_intermediates", 'load_inline(name="{N}", {S}, functions=["relu_forward"], keep_intermediates=True)'),
    Style("build_directory_none", 'load_inline(name="{N}", {S}, functions=["relu_forward"], build_directory=None)'),
    Style("empty_include_paths", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_include_paths=[])'),
    Style("functions_tuple", 'load_inline(name="{N}", {S}, functions=("relu_forward",))'),
    Style("positional_arguments", 'load_inline("{N}", {D_OR_K}, {CUDA_ONLY}functions=["relu_forward"])'),
    Style("aliased_import", 'compile_inline(name="{N}", {S}, functions=["relu_forward"])',
          builder_import="from torch.utils.cpp_extension import load_inline as compile_inline"),
    Style("module_attribute", 'cpp_extension.load_inline(name="{N}", {S}, functions=["relu_forward"])',
          builder_import="import torch.utils.cpp_extension as cpp_extension"),
    Style("built_in_init", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=[""])', in_init=True),
    Style("std_flag", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=["-std=c++20"])'),
    Style("define_flag", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=["-DRELU_VARIANT=1"], '
                         'extra_cuda_cflags=["-DRELU_VARIANT=1"])'),
    Style("warnings_flag", 'load_inline(name="{N}", {S}, functions=["relu_forward"], extra_cflags=["-Wall", "-O2"])'),
    Style("light_prelude", 'load_inline(name="{N}", {S}, functions=["relu_forward"])',
          cuda_sources=(LIGHT_CUDA_KERNEL % "", LIGHT_GLUE), cuda_prelude="light"),
    Style("light_prelude_retry", 'load_inline(name="{N}", {S}, functions=["relu_forward"])',
          cuda_sources=(LIGHT_CUDA_KERNEL % LAUNCH_ERROR_REPORT, LIGHT_GLUE), cuda_prelude="torch"),
    Style("syntax_error", 'load_inline(name="{N}", {S}, functions=["relu_forward"])', extra_source="\nthis is not C++;\n",
          compiles=False),
)


def solution_source(style: Style, device: str, tag: str) -> str:
    """The solution file of ``style`` for ``device`` (``cpu``: C++, ``cuda``: CUDA). ``tag`` makes
    the extension name (and so the build) unique to one test run."""
    cuda = device == "cuda"
    kernel = (CUDA_KERNEL if cuda else CPU_KERNEL) + style.extra_source
    declaration = DECLARATION + (SECOND_DECLARATION if "relu_twice" in style.extra_source else "")
    call = style.call.format(
        N=f"corpus_{style.name}_{device}_{tag}",
        S=_CUDA.format(D="declaration", K="kernel") if cuda else _CPU.format(K="kernel"),
        D_OR_K="declaration" if cuda else "kernel",
        CUDA_ONLY="cuda_sources=kernel, " if cuda else "",
        CUDA_LIST="cuda_sources=[kernel], " if cuda else "",
        WITH_CUDA="True" if cuda else "False",
    )
    if style.name == "own_pybind_module" and cuda:  # the module definition belongs to the C++ unit
        declaration += PYBIND
        kernel = CUDA_KERNEL
    if style.cuda_sources:
        assert cuda, f"corpus entry {style.name!r} is CUDA only"
        kernel, declaration = style.cuda_sources
    build = f"_ext = {call}\n" if not style.in_init else ""
    init = f"        self._ext = {call}\n" if style.in_init else "        self._ext = _ext\n"
    return (f'"""Corpus entry {style.name!r} ({device}): honest ReLU, differing only in the builder call."""\n\n'
            f"import torch\nimport torch.nn as nn\n{style.builder_import}\n\n"
            f"kernel = r'''{kernel}'''\ndeclaration = r'''{declaration}'''\n\n{build}\n\n"
            "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"{init}\n    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
            "        return self._ext.relu_forward(x.contiguous())\n")


def selected_styles(device: str) -> list[Style]:
    """The entries for ``device`` that ``CUDA_AGENT_BUILD_CORPUS`` selects: ``all``, or
    comma-separated entry names (default :data:`CI_ENTRIES`)."""
    wanted = os.environ.get("CUDA_AGENT_BUILD_CORPUS", ",".join(CI_ENTRIES))
    if wanted == "all":
        return [s for s in STYLES if device in s.devices]
    names = {n.strip() for n in wanted.split(",") if n.strip()}
    unknown = names - {s.name for s in STYLES}
    if unknown:
        raise ValueError(f"CUDA_AGENT_BUILD_CORPUS names unknown entries {sorted(unknown)}; "
                         f"valid: {', '.join(s.name for s in STYLES)}")
    return [s for s in STYLES if s.name in names and device in s.devices]


def run_differential(base: EvalConfig, root: Path) -> dict[str, dict[str, Verdict | str | None]]:
    """Build the selected entries for ``base.device`` with both builders at once,
    then evaluate each entry both ways: ``{name: {"lean": verdict, "torch": verdict,
    "cuda_prelude": the lean build's CUDA prelude, if it had a CUDA unit}}``."""
    tag = secrets.token_hex(4)  # a cold build each run, whatever the cache holds
    paths = {}
    for style in selected_styles(base.device):
        path = root / style.name / "solution.py"
        path.parent.mkdir(parents=True)
        path.write_text(solution_source(style, base.device, tag))
        paths[style.name] = path
    torch_builder = base.replace(build=BuildConfig(cuda_arch=base.build.cuda_arch, lean=False))
    solutions = [load_solution(p) for p in paths.values()]

    def build_all(config: EvalConfig) -> None:
        build_many(solutions, config.device, config.build, config.cache_dir,
                   max_parallel=max(1, (os.cpu_count() or 2) // 2), sandbox_config=config.sandbox)

    with ThreadPoolExecutor(max_workers=2) as pool:  # the builders side by side: one compiler process a build
        list(pool.map(build_all, (base, torch_builder)))
    task = load_task(TASK)
    with Prestarter(base, count=2) as prestarted:  # the two configs share a slot key
        return {name: {"lean": evaluate(task, path, base, prestarted=prestarted),
                       "torch": evaluate(task, path, torch_builder, prestarted=prestarted),
                       "cuda_prelude": _lean_cuda_prelude(path, base)}
                for name, path in paths.items()}


def _lean_cuda_prelude(path: Path, config: EvalConfig) -> str | None:
    _, _, extensions_dir = build_location(load_solution(path), config.device, config.build, config.cache_dir)
    manifest = extensions_dir / MANIFEST
    entries = json.loads(manifest.read_text()).values() if manifest.is_file() else []
    return next((e["cuda_prelude"] for e in entries if "cuda_prelude" in e), None)


def assert_same_verdict(style: Style, verdicts: dict[str, Verdict]) -> None:
    lean, torch_builder = verdicts["lean"], verdicts["torch"]
    assert torch_builder.compiled is style.compiles, (style.name, torch_builder.error)
    assert (lean.compiled, lean.status, lean.correct) == (torch_builder.compiled, torch_builder.status,
                                                           torch_builder.correct), (style.name, lean.error, torch_builder.error)
    if style.compiles:
        assert lean.correct, (style.name, lean.error)
    if style.cuda_prelude:
        assert verdicts["cuda_prelude"] == style.cuda_prelude, (style.name, verdicts["cuda_prelude"])

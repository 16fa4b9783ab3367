"""What the common public harness does (KernelBench-style), for side-by-side comparisons.

In the evaluating process: import the candidate module, whose ``load_inline`` compiles through
torch's JIT builder (``torch/extension.h`` in the generated C++ file, ninja, all cores); build
``Model`` and ``ModelNew`` under one seed; 5 correctness trials on fresh random inputs
(``allclose`` at 1e-2); then 100 timed trials of the candidate and 100 of the reference, each timed
with CUDA events around one call and a synchronize (the host clock on CPU). No sandbox, no separate
processes, no guards: a baseline for cost, not for trust.

    python bench/baseline_harness.py compile SOLUTION [--workdir]   # prints the compile seconds
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CORRECTNESS_TRIALS = 5
TIMED_TRIALS = 100
_WORKDIR_MODULE = """#include <torch/extension.h>
{declarations}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{
{calls}
}}
"""


def _import(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    return module


def compile_single_file(solution: Path, extensions_dir: Path) -> tuple[Any, float]:
    """Import the candidate (its ``load_inline`` compiles); returns the module and the seconds."""
    os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir)
    started = time.perf_counter()
    module = _import(solution, f"candidate_{solution.stem}")
    return module, time.perf_counter() - started


def compile_workdir(root: Path, extensions_dir: Path) -> float:
    """torch's ``load`` over ``kernels/`` plus a module file including ``torch/extension.h`` (the
    protected build before the lean path); returns the seconds."""
    from torch.utils.cpp_extension import load

    names = sorted(p.name[: -len("_binding.cpp")] for p in (root / "kernels").glob("*_binding.cpp"))
    module = extensions_dir / "module.cpp"
    extensions_dir.mkdir(parents=True, exist_ok=True)
    module.write_text(_WORKDIR_MODULE.format(
        declarations="\n".join(f"void register_{n}(pybind11::module_& m);" for n in names),
        calls="\n".join(f"    register_{n}(m);" for n in names)))
    sources = [str(p) for p in sorted((root / "kernels").iterdir()) if p.suffix in (".cu", ".cpp", ".cc")]
    started = time.perf_counter()
    load(name=f"bench_{root.name}", sources=[*sources, str(module)], build_directory=str(extensions_dir),
         extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], extra_include_paths=[str(root / "kernels")])
    return time.perf_counter() - started


def _time_ms(fn, inputs: list, device: str) -> float:
    import torch

    if device != "cuda":
        started = time.perf_counter()
        fn(*inputs)
        return (time.perf_counter() - started) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*inputs)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def evaluate_in_process(task_path: Path, solution: Path, device: str) -> dict[str, Any]:
    """One candidate the KernelBench way; returns compile seconds, correctness and timings."""
    import statistics

    import torch

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kb-style-") as extensions_dir:
        candidate, compile_s = compile_single_file(solution, Path(extensions_dir))
        task = _import(task_path, f"task_{task_path.stem}_{id(solution)}")
        torch.manual_seed(42)
        init = task.get_init_inputs()
        torch.manual_seed(42)
        reference = task.Model(*init).to(device)
        torch.manual_seed(42)
        model = candidate.ModelNew(*init).to(device)
        correct = True
        with torch.no_grad():
            for trial in range(CORRECTNESS_TRIALS):
                torch.manual_seed(1000 + trial)
                inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
                correct &= bool(torch.allclose(model(*inputs), reference(*inputs), atol=1e-2, rtol=1e-2))
            timed = {}
            for label, fn in (("candidate", model), ("reference", reference)):
                timed[label] = statistics.median(_time_ms(fn, inputs, device) for _ in range(TIMED_TRIALS))
    return {"compile_s": compile_s, "correct": correct, "candidate_ms": timed["candidate"],
            "reference_ms": timed["reference"], "seconds": time.perf_counter() - started}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "compile":
        print(__doc__, file=sys.stderr)
        return 2
    import torch  # noqa: F401 - imported before the clock starts, as in an evaluating process

    with tempfile.TemporaryDirectory(prefix="kb-style-") as extensions_dir:
        path = Path(argv[1])
        seconds = compile_workdir(path, Path(extensions_dir)) if "--workdir" in argv else \
            compile_single_file(path, Path(extensions_dir))[1]
    print(f"{seconds:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Per-call overhead of the two workdir binding contracts, side by side in one process.

The bundled ReLU sample in the binding contract (``kernels/relu_binding.cpp``: a pybind11 function
taking and returning ``torch::Tensor``) and in the fast contract (a launcher called through the
harness's shim, which also makes the output the launcher asks for) are built by the protected
build, then called alternately on a tiny tensor, so that the kernel's own work is negligible and
what is measured is the call: argument conversion, allocation of the output, dispatch. Reported
per contract: the median over rounds of the mean ns per call. Prints one summary line and writes
JSON.

    python bench/call_overhead.py --device cpu --out bench/results/call_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

from benchlib import device_label, machine_details, median, sample_solution, write_json

from cuda_agent.environment import BuildConfig
from cuda_agent.environment.build import build_solution
from cuda_agent.environment.solution import EXTENSION_NAME, load_solution


def _module(device: str, contract: str, cache_dir: Path):
    """The built ``cuda_extension`` of the ReLU sample in ``contract`` (each from its own file)."""
    built = build_solution(load_solution(sample_solution(device, "relu", contract)), device, BuildConfig(), cache_dir)
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, built.extensions_dir / f"{EXTENSION_NAME}.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ns_per_call(call, calls: int, synchronize) -> float:
    started = time.perf_counter_ns()
    for _ in range(calls):
        call()
    synchronize()
    return (time.perf_counter_ns() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--elements", type=int, default=16, help="tensor size (tiny: the call dominates)")
    parser.add_argument("--calls", type=int, default=20000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cache-dir", type=Path, default=None, help="build cache (default: a fresh temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args()

    import torch

    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="cuda-agent-bench-calls-"))
    binding, launcher = _module(args.device, "binding", cache_dir), _module(args.device, "launcher", cache_dir)
    x = torch.randn(args.elements, device=args.device)
    calls = {"binding": lambda: binding.relu_forward(x), "launcher": lambda: launcher.relu_forward(x)}
    if not all(torch.equal(call(), torch.relu(x)) for call in calls.values()):
        raise SystemExit("a contract's ReLU disagrees with torch.relu")
    synchronize = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    rounds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):  # alternate, so drifting machine load falls on every contract alike
        for name, call in calls.items():
            rounds[name].append(_ns_per_call(call, args.calls, synchronize))
    ns = {name: median(values) for name, values in rounds.items()}
    details = machine_details()
    result = {"device": device_label(details), "machine": details, "backend": args.device, "elements": args.elements,
              "calls_per_round": args.calls, "ns_per_call": ns, "rounds_ns_per_call": rounds,
              "launcher_vs_binding": ns["launcher"] / ns["binding"]}
    print(f"call overhead ({args.device}, {args.elements} elements): binding {ns['binding']:.0f} ns, launcher "
          f"{ns['launcher']:.0f} ns ({result['launcher_vs_binding']:.2f}x)")
    write_json(result, args.out)


if __name__ == "__main__":
    main()

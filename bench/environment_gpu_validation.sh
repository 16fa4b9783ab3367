#!/usr/bin/env bash
# GPU validation of the evaluation environment, in two steps that each fit one 10-minute call on a
# GPU host (logs and JSON go to $OUT, or ./gpu-validation-out when OUT is unset):
#
#   bash bench/environment_gpu_validation.sh safety   # red team, fault suite, sandbox, CUDA tests
#   bash bench/environment_gpu_validation.sh perf     # latency, throughput, differential build corpus
#
# Both steps share one cache (CUDA_AGENT_TEST_CACHE_DIR, C) while the machine stays up. Every
# command has its own time limit, so a slow one cannot take the others' results with it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export C=${C:-/tmp/cuda-agent-gpu-validation}
export CUDA_AGENT_TEST_CACHE_DIR=$C
OUT=${OUT:-$PWD/gpu-validation-out}
mkdir -p "$C" "$OUT"
step=${1:?usage: environment_gpu_validation.sh safety|perf}

run() {  # run NAME LIMIT_S COMMAND...: log to $OUT/NAME.log, keep the last lines on stdout
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - started)) s"
    tail -n 6 "$OUT/$name.log"
}

case $step in
safety)
    nvidia-smi -L
    # CPU-device suites in parallel (the red team's CPU rows, faults incl. 100 honest evaluations,
    # sandbox), then the CUDA ones one at a time (device OOM and hangs must not share the GPU).
    run cpu_safety 300 python -m pytest -q -n 8 -p no:cacheprovider tests/redteam \
        tests/environment/test_evaluator_faults.py tests/environment/test_sandbox.py \
        tests/environment/test_build_sandbox.py
    run cuda_safety 240 python -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_cuda_faults.py \
        tests/gpu/test_gpu_faults.py tests/gpu/test_cuda_sandbox_and_timing.py tests/gpu/test_cuda_samples.py \
        tests/gpu/test_launchers_cuda.py
    ;;
perf)
    run latency 150 python bench/verify_latency.py --device cuda --task relu --runs 8 --uncached-runs 2 \
        --cli-runs 3 --cache-dir "$C" --out "$OUT/verify_latency_cuda.json"
    run throughput 230 python bench/throughput.py --device cuda --tasks relu softmax rmsnorm --candidates 40 \
        --baseline-candidates 4 --time-budget-s 210 --cache-dir "$C" --out "$OUT/throughput_cuda.json"
    CUDA_AGENT_BUILD_CORPUS=all run differential 180 python -m pytest -q -p no:cacheprovider -m gpu \
        tests/gpu/test_build_differential_cuda.py
    ;;
*)
    echo "unknown step $step (safety or perf)" >&2
    exit 2
    ;;
esac

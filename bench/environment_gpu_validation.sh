#!/usr/bin/env bash
# GPU validation of the evaluation environment, in six steps that each fit one 10-minute call on a
# 16-core GPU host (timings from an H100/H200 on 2026-11-26; logs and JSON go to $OUT, or
# ./gpu-validation-out when OUT is unset; each failure's report is appended to
# $OUT/failures.txt as it happens, so a step stopped by its limit still says why):
#
#   bash bench/environment_gpu_validation.sh safety-cpu   # red team, faults, sandbox on the CPU device (~8 min)
#   bash bench/environment_gpu_validation.sh safety-cuda  # CUDA red team, GPU faults, sandboxed CUDA timing (~5 min)
#   bash bench/environment_gpu_validation.sh builds       # CUDA samples, launcher contract (~6 min cold)
#   bash bench/environment_gpu_validation.sh perf         # build contracts, latency, throughput (~8 min)
#   bash bench/environment_gpu_validation.sh timing       # timing repeatability, with and without a CPU set apart (~7 min)
#   bash bench/environment_gpu_validation.sh precision    # precision calibration, CUDA differential corpus (~5 min)
#   bash bench/environment_gpu_validation.sh real-sizes   # device sharing tests, verdicts 0.25-17 GB, KernelBench's harness (~9 min)
#   bash bench/environment_gpu_validation.sh selfcheck    # tasks check over KernelBench levels 1-3, resumable (9 min a call)
#   bash bench/environment_gpu_validation.sh workers      # workers forked from a zygote vs exec'd: verdicts, seconds (~6 min)
#
# real-sizes and selfcheck need a KernelBench checkout in KB (default: ./.kb, the layout of
# `git archive` of KernelBench's KernelBench/ and src/ folders) and, where pydantic and
# python-dotenv are missing, their wheels in ./.whl (KernelBench's harness imports them).
#
# The steps share one cache (CUDA_AGENT_TEST_CACHE_DIR, C) while the machine stays up; a cold
# cache first builds the precompiled header, torch's flags and the launcher shim (a minute or more).
# Every command has its own time limit, so a slow one cannot take the others' results with it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export C=${C:-/tmp/cuda-agent-gpu-validation}
export CUDA_AGENT_TEST_CACHE_DIR=$C
OUT=${OUT:-$PWD/gpu-validation-out}
export CUDA_AGENT_TEST_FAILURE_LOG=$OUT/failures.txt
mkdir -p "$C" "$OUT"
step=${1:?usage: environment_gpu_validation.sh safety-cpu|safety-cuda|builds|perf|timing|precision|real-sizes|selfcheck|workers}
KB=${KB:-$PWD/.kb}
WORK=${WORK:-/tmp/cuda-agent-real-sizes}

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
workers)
    nvidia-smi -L
    # Both workers forked from a zygote must judge as exec'd ones do (the bench exits non-zero on any
    # verdict other than correct); then the sandboxed CUDA timing tests, forked. (A dataset check,
    # bench/dataset_check.py, runs lanes sharing a GPU the same way.)
    run worker_start 240 python bench/worker_start.py --device cuda --runs 3 --out "$OUT/worker_start_cuda.json"
    run zygote_gpu 150 python -m pytest -v -m gpu --timeout 140 -p no:cacheprovider \
        tests/gpu/test_cuda_sandbox_and_timing.py
    ;;
safety-cpu)
    nvidia-smi -L
    # 6 pytest workers: 183 tests in ~8 min on an H200 host; 60 honest evaluations in a row (CI runs 100).
    CUDA_AGENT_FAULT_HONEST_RUNS=60 run cpu_safety 560 python -m pytest -v -n 6 --timeout 400 -p no:cacheprovider \
        tests/redteam tests/environment/test_evaluator_faults.py tests/environment/test_sandbox.py \
        tests/environment/test_build_sandbox.py tests/environment/test_worker.py
    ;;
safety-cuda)
    # One at a time: device OOM and hangs must not share the GPU with another test.
    run cuda_safety 560 python -m pytest -v -m gpu --timeout 300 -p no:cacheprovider tests/redteam \
        tests/gpu/test_cuda_sandbox_and_timing.py tests/gpu/test_gpu_faults.py tests/gpu/test_cuda_faults.py
    ;;
builds)
    run cuda_builds 400 python -m pytest -v -m gpu --timeout 300 -p no:cacheprovider tests/gpu/test_cuda_samples.py \
        tests/gpu/test_launchers_cuda.py
    ;;
perf)
    run contracts 120 python bench/compile.py --device cuda --tasks relu --variants 1 --cache-dir "$C" \
        --out "$OUT/compile_contracts_cuda.json"
    run latency 230 python bench/verify_latency.py --device cuda --task relu --runs 4 --uncached-runs 1 \
        --cli-runs 3 --cache-dir "$C" --out "$OUT/verify_latency_cuda.json"
    run throughput 240 python bench/throughput.py --device cuda --tasks relu softmax rmsnorm --candidates 40 \
        --baseline-candidates 3 --time-budget-s 200 --cache-dir "$C" --out "$OUT/throughput_cuda.json"
    ;;
timing)
    # The sizes with targets (10 us, 100 us, 1 ms). Builds and baselines first (a cold cache: about
    # 2 min on an H200), then the repeats; the second run is the same with no CPU set apart for
    # timing, for comparison (its baselines are timed again: they are cached per setting).
    run timing 260 python bench/timing.py --device cuda --sizes 10us 100us 1ms --repeats 12 --time-budget-s 220 \
        --cache-dir "$C" --out "$OUT/timing_cuda.json"
    CUDA_AGENT_TIMED_CPU=off run timing_not_set_apart 170 python bench/timing.py --device cuda --sizes 10us 100us \
        --repeats 12 --time-budget-s 140 --cache-dir "$C" --out "$OUT/timing_cuda_not_set_apart.json"
    ;;
precision)
    # The calibration (~4 min on an H200; step-by-step emulations run on the host) and the CUDA
    # differential corpus (torch's own builder compiles each style in the candidate worker: ~5 min
    # for these 5 on a cold cache) side by side.
    run calibration 330 python bench/precision_calibration.py --device cuda --markdown \
        --out "$OUT/precision_calibration_cuda.json" &
    CUDA_AGENT_BUILD_CORPUS=kernelbench_fewshot,functions_string,syntax_error,light_prelude,light_prelude_retry \
        run differential 330 python -m pytest -v -m gpu --timeout 320 -p no:cacheprovider \
        tests/gpu/test_build_differential_cuda.py &
    wait
    ;;
real-sizes)
    if ls .whl/*.whl >/dev/null 2>&1; then  # KernelBench's own imports, where the image lacks them
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            && export PYTHONPATH=$PYTHONPATH:/tmp/site
    fi
    run device_sharing 150 python -m pytest -v -m gpu --timeout 140 -p no:cacheprovider tests/gpu/test_device_sharing.py
    run real_sizes 420 python bench/real_sizes.py --parts sizes kernelbench --kernelbench "$KB" --work "$WORK" \
        --cache-dir "$C" --time-budget-s 400 --out "$OUT/real_sizes.json"
    ;;
selfcheck)
    # GPUS=0 for the one-GPU figures (default: every GPU; KEY=selfcheck_4gpu names a 4-GPU run's JSON key)
    run selfcheck 560 python bench/real_sizes.py --parts selfcheck --levels ${LEVELS:-1 2 3} --kernelbench "$KB" \
        --work "$WORK" --cache-dir "$C" --time-budget-s 540 --selfcheck-key "${KEY:-selfcheck}" ${GPUS:+--gpus "$GPUS"} \
        --out "$OUT/real_sizes_selfcheck.json"
    ;;
*)
    echo "unknown step $step (safety-cpu, safety-cuda, builds, perf, timing, precision, real-sizes, selfcheck or workers)" >&2
    exit 2
    ;;
esac

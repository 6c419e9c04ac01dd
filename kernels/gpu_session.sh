#!/usr/bin/env bash
# Issue 16's GPU checks in one device call (docs/sim_to_real.md#profiling-a-gpu): the kernels'
# check (kernels/gpu_check.py, fp8 K/V included), the real executor's GPU path against stock
# generation (and fp8 pools through Triton against torch's kernels), a
# profile of a random-weight Llama-3-8B (bf16, Triton decode), then sim-to-real on the GPU
# (experiment=sim_to_real with that model). Everything it writes comes back as
# $OUT/gpu_session.tar.gz and $OUT/gpu_session.log.
#
#   bash kernels/gpu_session.sh prepare   # here: .gpu/ = the wheels the GPU image lacks, the
#                                         # kvbench wheel, the three trace slices' files
#   device run: command "bash kernels/gpu_session.sh run", carry [".gpu"], timeout_s 590
#   bash kernels/gpu_session.sh dry-run   # here, after prepare: the same steps on this CPU,
#                                         # SmolLM2-shaped
#
# Each step has its own time limit and a failing step does not stop the next: one call of at
# most 10 minutes returns whatever finished. The GPU image has torch, triton, pandas, pyarrow,
# scipy, matplotlib and pytest, not hydra or datasets (/work/.library/device/KINDS.md).
set -uo pipefail
cd "$(dirname "$0")/.."

GPU_DIR=.gpu
TRACES=(alpaca/alpaca_5000_gpt2bpe_lengths.csv sharegpt/sharegpt_val_10k_llama2.csv
        azure2023/AzureLLMInferenceTrace_conv.csv)
# Pinned to versions kvbench is tested with (and what datasets and hydra need). transformers
# stays at 5.24.0: 5.25 needs huggingface-hub >= 2.4, and the GPU image has 1.33 (KINDS.md).
WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
        transformers==5.24.0)

prepare() {
  rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/wheels" "$GPU_DIR/traces"
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d "$GPU_DIR/wheels" "${WHEELS[@]}" || return 1
  # antlr4 4.9.3 (omegaconf's parser runtime) is published as source only: built here.
  python -m pip wheel -q --no-deps -w "$GPU_DIR/wheels" antlr4-python3-runtime==4.9.3 || return 1
  python -m pip wheel -q --no-deps --no-build-isolation -w "$GPU_DIR/wheels" . || return 1
  for trace in "${TRACES[@]}"; do
    cp "../shared/traces/$trace" "$GPU_DIR/traces/$(basename "$trace")" || return 1
  done
  du -sh "$GPU_DIR"
}

# The catalog's name (conf/hardware) of a GPU named as nvidia-smi names it: the profile's file
# and the runs are labelled by it. The device tool lends H100s and H200s; a GPU the catalog lacks
# is said so on stderr and labelled h100-80gb (the profile still records its real name).
hardware_of() {
  case "$1" in
    *H200*) echo h200-141gb ;;
    *H100*) echo h100-80gb ;;
    *A100*80GB*) echo a100-80gb ;;
    *A100*) echo a100-40gb ;;
    *L40S*) echo l40s ;;
    *) echo "GPU '$1' is not in conf/hardware: its runs are labelled h100-80gb" >&2
       echo h100-80gb ;;
  esac
}

# The steps' settings: a random-weight catalog model on the GPU, or SmolLM2's shape on this CPU.
settings() {
  if [ "$1" = run ]; then
    # executor.device=auto: cuda there (were the GPU not seen, triton on the CPU is refused).
    local gpu_name
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    MODEL=(model=llama-3-8b model.dtype=bf16 "hardware=$(hardware_of "$gpu_name")"
           executor.weights=random executor.decode_backend=triton executor.num_threads=null)
    # The profile's grid: a GPU's batches (to 256) and contexts (to 3,072 tokens), in 2 rounds,
    # not 3: each round sets every point up anew, and 3 rounds might not fit
    # the step's 150 s (the grid has not run on a GPU yet); a lent GPU is not shared, so its slow
    # spells are rarer than this project's CPU's.
    GRID=(profile_grid=gpu profile_grid.repeats=2)
    # sim_to_real's 186-slot pool (naive_max reserves 64 per request) at Llama-3-8B's 128 KiB
    # of bf16 K/V per token; rates past a GPU's knee (its steps are ~10x a CPU's shorter); no
    # second pass (its runs at 1 req/s would wait ~75 s more for arrivals than the limit holds).
    SIM=(hardware.kv_cache_gib=0.02271 "workload_request_rates.alpaca=[1.0,16.0]"
         "workload_request_rates.sharegpt=[1.0,16.0]" "workload_request_rates.azure_conv=[1.0,16.0]"
         sim_to_real.repeat_replays=false)
    # Seconds: gpu_check first (it needs only torch and triton; rows stop after its budget),
    # gpu tests, profile (99 points and 6 swaps in 2 rounds, 3 runs each, 5 s of idle waits),
    # sim_to_real (its runs at 1 req/s wait ~75 s for arrivals): 540 s, with the preamble's
    # wheel install inside the call's 590.
    LIMITS=(80 150 180)
    CHECK_LIMIT=130
    CHECK=(--time-budget-s 80)
  else
    MODEL=(model=smollm2-135m model.dtype=fp32 hardware=cpu executor.weights=random
           executor.device=cpu executor.decode_backend=sdpa executor.num_threads=2)
    GRID=()
    SIM=()
    LIMITS=(300 600 900)
    CHECK_LIMIT=900
    CHECK=(--cpu-dry-run)
    export TRITON_INTERPRET=1
  fi
}

step() {  # step NAME SECONDS COMMAND...: run it under its limit, log its exit status
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit} s) $(date -u +%T)"
  timeout "$limit" "$@"
  echo "=== $name: exit $? at $(date -u +%T)"
  # On the device, pack what exists after every step: a call cut short still returns it.
  if [ -n "${PACK:-}" ]; then tar -czf "$PACK" -C "$(dirname "$RUNS")" "$(basename "$RUNS")"; fi
}

# The dry run's sim_to_real reads the traces prepare copies: without them, say so before any
# step runs. (On the device a missing trace fails only that step: gpu_check needs none.)
check_prepared() {
  local trace
  for trace in "${TRACES[@]}"; do
    if [ ! -f "$GPU_DIR/traces/$(basename "$trace")" ]; then
      echo "$GPU_DIR/traces/$(basename "$trace") is missing: run 'bash kernels/gpu_session.sh" \
        "prepare' here first (it copies the traces and the wheels into $GPU_DIR/)" >&2
      return 1
    fi
  done
}

run_steps() {
  local mode=$1 runs=$2
  RUNS=$runs
  settings "$mode"
  mkdir -p "$runs"
  # The kernel check first: it needs only torch and triton, and its report is rewritten after
  # every row, so its time limit loses nothing it measured.
  step gpu_check "$CHECK_LIMIT" python3 kernels/gpu_check.py "${CHECK[@]}" \
    --out "$runs/gpu_check.json"
  step "gpu tests" "${LIMITS[0]}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_real_executor.py tests/test_kernels_decode.py
  step profile "${LIMITS[1]}" python3 -m kvbench task=profile "${MODEL[@]}" "${GRID[@]}" \
    summary_table=false "hydra.run.dir=$runs/profile"
  step sim_to_real "${LIMITS[2]}" python3 -m kvbench experiment=sim_to_real "${MODEL[@]}" \
    "${SIM[@]}" "workloads.alpaca.path=$GPU_DIR/traces/alpaca_5000_gpt2bpe_lengths.csv" \
    "workloads.sharegpt.path=$GPU_DIR/traces/sharegpt_val_10k_llama2.csv" \
    "workloads.azure_conv.path=$GPU_DIR/traces/AzureLLMInferenceTrace_conv.csv" \
    summary_table=false "hydra.run.dir=$runs/sim_to_real"
}

case "${1:-}" in
  prepare) prepare ;;
  run)
    export PYTHONUNBUFFERED=1
    out=${OUT:?run on the device machine, where \$OUT is set}
    {
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        "$GPU_DIR"/wheels/*.whl && export PYTHONPATH=/tmp/site
      python3 -c "import importlib.metadata as m, torch; print(torch.cuda.get_device_name(), *(
        f'{name} {m.version(name)}' for name in ('torch', 'triton', 'transformers', 'pandas',
        'pyarrow', 'numpy', 'datasets', 'hydra-core', 'kvbench')))"
      PACK="$out/gpu_session.tar.gz" run_steps run /tmp/gpu_session
    } 2>&1 | tee "$out/gpu_session.log"
    ;;
  dry-run)
    export PYTHONUNBUFFERED=1
    check_prepared || exit 1
    run_steps dry-run "${2:-/tmp/gpu_session_dry}" 2>&1 | tee "${2:-/tmp/gpu_session_dry}.log"
    ;;
  hardware-of) hardware_of "${2:?usage: $0 hardware-of GPU_NAME}" ;;
  *) echo "usage: $0 prepare | run | dry-run [DIR] | hardware-of GPU_NAME" >&2; exit 2 ;;
esac

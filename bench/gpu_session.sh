#!/usr/bin/env bash
# One GPU loan, prepared: the CUDA-only tests, then the GPU table (bench.gpu_suite's parts in the
# order the GPU goals need them), each part bounded in time so that the whole fits one call.
#
# Why a script: a loan is short and starts bare. The machine has Python, PyTorch and CUDA but none
# of the service's own dependencies; they travel as wheels in .whl/ (see docs/benchmarks.md,
# "Running the GPU suite on a lent machine", for how to fetch them). Everything it measures lands
# under $OUT: gpu_table.md (the Markdown table), cuda_tests.log and the embedded service's log.
#
#     OUT=/tmp/gpu bash bench/gpu_session.sh            # on the GPU machine, from the repo root
#     GPU_SESSION_BUDGET=300 bash bench/gpu_session.sh  # seconds in all (default 510: one 10-minute call)
set -u
OUT=${OUT:-/tmp/gpu-session}
BUDGET=${GPU_SESSION_BUDGET:-510}  # seconds from the start, the install and tests included
DEVICE=${GPU_SESSION_DEVICE:-cuda}  # cpu: a dry run of the plumbing on any machine
mkdir -p "$OUT"
started=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "the wheels did not install"; exit 1; }
    export PYTHONPATH="/tmp/site:$PWD:$PWD/common:$PWD/client"
else
    export PYTHONPATH="$PWD:$PWD/common:$PWD/client"
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader >"$OUT/machine.txt" 2>&1
python3 - <<'EOF' | tee -a "$OUT/machine.txt"
import opacus, torch, transformers
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"opacus {opacus.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
EOF

# 1. The CUDA-only tests (skipped on every other machine).
timeout 120 python3 -m pytest -p no:cacheprovider -q -k "cuda or gpu" \
    tests/unit/worker/test_worker_rows.py tests/unit/worker/test_worker_secure_random.py \
    tests/unit/worker/test_worker_ht_algorithms.py tests/unit/worker/test_worker_ghost.py \
    tests/unit/worker/test_worker_token_rows.py >"$OUT/cuda_tests.log" 2>&1
echo "CUDA tests: exit $?"; tail -15 "$OUT/cuda_tests.log"

# 2. The GPU table: the parts the goals are judged by first, each run by the suite (time limits,
# a failure recorded and the run going on), what is left of the budget to each.
left() { echo $((BUDGET - ($(date +%s) - started))); }
suite() {  # suite OUT_NAME PART_TIMEOUT ARGS...
    local name=$1 part_timeout=$2; shift 2
    local budget; budget=$(left)
    if [ "$budget" -lt 20 ]; then echo "## $name: not run (budget spent)" >>"$OUT/gpu_table.md"; return; fi
    python3 -m bench.gpu_suite --device "$DEVICE" --quick --part-timeout "$part_timeout" --budget "$budget" \
        --out "/tmp/$name.md" "$@" >/dev/null 2>>"$OUT/suite.err"
    cat "/tmp/$name.md" >>"$OUT/gpu_table.md"; echo >>"$OUT/gpu_table.md"
    [ -f "/tmp/$name.service.log" ] && cat "/tmp/$name.service.log" >>"$OUT/service.log"
}
: >"$OUT/gpu_table.md"
hf_engines() {  # the Hugging Face models: vmap engine against non-private (the ghost engine refuses them)
    local budget; budget=$(left)
    [ "$budget" -gt 60 ] && budget=60
    if [ "$budget" -lt 20 ]; then echo "## Hugging Face models: not run (budget spent)" >>"$OUT/gpu_table.md"; return; fi
    {
        echo "## Hugging Face models (vmap engine; the ghost engine refuses them)"
        echo
        timeout "$budget" python3 -m bench.engine_compare --device "$DEVICE" --repeats 5 \
            --cases hf-bert-t128-b64,hf-gpt2-t128-b32,hf-gpt2-lora-t128-b32 2>>"$OUT/suite.err"
        echo
    } >>"$OUT/gpu_table.md"
}
suite engines 130 --only "Engines (float32)"
patch_block_ab() {  # the conv patch block at 2^22 (the default) and 2^26 values in one run: launches against memory
    local budget; budget=$(left)
    [ "$budget" -gt 60 ] && budget=60
    if [ "$budget" -lt 20 ]; then echo "## Patch block A/B: not run (budget spent)" >>"$OUT/gpu_table.md"; return; fi
    {
        echo "## Patch block A/B: 2^26 values (the default of 2^22 is the Engines table above)"
        echo
        timeout "$budget" python3 -m bench.engine_compare --device "$DEVICE" --repeats 5 --skip-opacus \
            --cases cnn3-b1024,wrn16-4-b256 --patch-block-elements 67108864 2>>"$OUT/suite.err"
        echo
    } >>"$OUT/gpu_table.md"
}
patch_block_ab
suite algorithms 60 --only "Whole steps per algorithm,Whole job through the worker"
suite profile 50 --profile --only "Profiles"
hf_engines
suite memory 45 --only "Ghost engine peak memory,Engines (bf16 autocast)"
suite loop 40 --only "Training loop parts: wrn 16-4, chunks of 2048,DC-DPSGD per engine,Text fine-tuning"
echo "session: $(($(date +%s) - started)) s"

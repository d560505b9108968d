#!/usr/bin/env bash
# The GPU checks and measurements of BENCHMARKS.md ("On one GPU"), in one script.
#
#   bash benchmarks/gpu_proof.sh [PARTS...]      # default: tests dp bench esm
#
# Parts (each capped in time so the whole script fits a short GPU lease; logs go to $OUT,
# default ./gpu-proof):
#   tests  the `gpu`-marked tests and the model, train, parallel and packing tests with a GPU
#          present (pytest-xdist when installed)
#   dp     data parallelism with two gloo ranks sharing the GPU against one process
#   bench  benchmarks/bench_gpu.py at the gpu-1b shape: `epochal train` vs transformers'
#          LlamaForCausalLM compiled (BENCH_ROWS to choose rows), with a profile summary
#   esm    benchmarks/bench_packing.py: ESM-2 650M and 8M shapes, bf16, padded vs packed
#
# It installs epochal without dependencies into the machine's Python (which has a CUDA torch);
# it never installs torch.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-proof}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(tests dp bench esm)
has() { [[ " ${PARTS[*]} " == *" $1 "* ]]; }

$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || {
    echo "install failed"; tail -5 "$OUT/install.log"; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY -c "import torch, transformers, sys; print('python', sys.version.split()[0], '| torch', \
torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(), \
'| transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/env.txt"

if has tests; then
    XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 12" || echo "")
    # shellcheck disable=SC2086  # (TEST_PATHS: other test paths, space-separated)
    timeout "${TESTS_TIMEOUT:-200}" $PY -m pytest -p no:cacheprovider -q -rfE $XDIST \
        ${TEST_PATHS:-tests/gpu tests/model tests/train tests/parallel tests/data/test_packing.py} \
        >"$OUT/tests.log" 2>&1
    echo "tests: exit $? ($(grep -cE '^(FAILED|ERROR)' "$OUT/tests.log") failed/errors)"
    grep -E '^(FAILED|ERROR)|passed|failed' "$OUT/tests.log" | tail -25
fi

if has dp; then
    D=$(mktemp -d)
    COMMON=(--preset=tiny --training.device=${DEVICE:-cuda} --training.train_iters=8 --training.compile=false
        --data.corpus_max_bytes=300000 --training.eval_interval=0 --training.eval_iters=0
        --checkpoint.save_interval=0 --logging.progress=false --logging.tensorboard=false
        ${DP_EXTRA:-})
    timeout 150 epochal train "${COMMON[@]}" --run_dir="$D/one" >"$OUT/dp_one.log" 2>&1
    timeout 150 epochal train "${COMMON[@]}" --run_dir="$D/two" --parallel.data_parallel=2 \
        --parallel.backend=gloo >"$OUT/dp_two.log" 2>&1
    $PY - "$D" <<'EOF' 2>&1 | tee "$OUT/dp.txt"
import json, sys
from pathlib import Path
def losses(run):
    path = Path(sys.argv[1]) / run / "metrics.jsonl"
    if not path.is_file():
        return None
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "train"]
one, two = losses("one"), losses("two")
if not one or not two:
    print("dp: a run failed (see dp_one.log / dp_two.log)")
else:
    diff = max(abs(a - b) for a, b in zip(one, two))
    same = sum(a == b for a, b in zip(one, two))
    print(f"dp: 1 process vs DP2 (gloo, one GPU), {len(one)} steps: {same} bit-equal, max |diff| {diff:.3g}")
EOF
fi

if has bench; then
    timeout "${BENCH_TIMEOUT:-260}" $PY benchmarks/bench_gpu.py --rows "${BENCH_ROWS:-trainer,hf-compiled}" \
        --warmup "${BENCH_WARMUP:-3}" --steps "${BENCH_STEPS:-6}" --profile --keep-trace "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_gpu.md"
fi

if has esm; then
    timeout 120 $PY benchmarks/bench_packing.py --model esm2-650m --bf16 --micro-batch 16 \
        --steps 4 2>&1 | tee "$OUT/esm650m.md"
    timeout 60 $PY benchmarks/bench_packing.py --model esm2-8m --bf16 --micro-batch 16 \
        --steps 4 2>&1 | tee "$OUT/esm8m.md"
fi

#!/usr/bin/env bash
# The checks a lent GPU runs, in one go, each under its own time limit so that one hang costs only its share:
# the device and its software; the Triton renderer's own tests; bench/lstm_gpu.py (times against cuDNN and with
# CUDA graphs, errors against float64, nnforge's time by kernel); bench/compile_gpu.py (a 5-layer stack's cold
# first call, new lengths building nothing); the backend-parametrized test matrix on backend "triton" with real
# kernels; the whole-model tests; a streamed training loop's copies against its kernels
# (tests/control/test_staging.py, bench/feeder.py with a profiler trace); each model's error against float64 per
# dtype (bench/precision_gpu.py); Nsight Compute's stall reasons of the persistent scans (bench/scan_stalls_gpu.py);
# layer norms and softmaxes of whole rows (bench/rows_gpu.py); a transformer encoder layer against torch and
# torch.compile (bench/transformer_gpu.py); bench/lstm_gpu.py against FlashRNN; ModelView's
# GPU tests (CUDA events, NVML, a CUDA out-of-memory cell as a row); the ModelView sweep of
# scripts/gpu-sweep.toml into $OUT/gpu-sweep.db (resumed where a run of it stopped; `nnforge report` draws it on
# any machine). Run from the repository root on a machine with a CUDA GPU; logs go to $OUT (default gpu-out/).
#
#   scripts/gpu-check.sh                    # everything
#   BENCH="--hidden 96 --batch 128" scripts/gpu-check.sh   # bench/lstm_gpu.py's arguments
#   VARIANTS="split_k_outputs=0 gemm_k=64" scripts/gpu-check.sh  # the bench step also times these, interleaved
#   BENCH_S=300 MATRIX_S=300 scripts/gpu-check.sh           # the limits, in seconds
#   STEPS="render bench" scripts/gpu-check.sh               # some of the steps
#   SELECT="cast_to_int or save" scripts/gpu-check.sh      # the matrix step runs only the triton cases matching
#   STEPS="tune bench" scripts/gpu-check.sh  # tune the Triton tiles for this GPU first (opt-in: not in the default)
#   STEPS=flashrnn scripts/gpu-check.sh      # bench/lstm_gpu.py against FlashRNN (installed from gpu-wheels/, made by
#                                            # `make gpu-wheels` and carried; its CUDA kernel builds with nvcc per shape)
#   STEPS=sweep SWEEP_FROM=gpu-sweep.db scripts/gpu-check.sh  # continue a sweep a lease cut short
#   STEPS=wide scripts/gpu-check.sh          # batch 8448 at 8 and 16 rows per persistent program (opt-in)
#
# The steps run in order of what a short lease should learn first; their limits add up to more than one 10-minute
# command, so a lease runs `STEPS="render bench compile"` first, `STEPS="matrix whole_model"` second and the rest
# where time is left (each step's log is in $OUT as soon as it ends: a command cut short returns those it finished).
# With PARALLEL=1 the timed steps (tune bench compile cells flashrnn) run first, alone on the GPU, then the
# checks side by side in three groups — matrix; render and whole_model; precision and streams — each under its
# own limits (2026-11-27 on a 16-core H200 machine: bench with --rounds 3 and compile, then those checks, 330 s).
# Before a lease, `python scripts/gpu-build.py` on any machine finds kernels a GPU build refuses.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
export NNFORGE_CACHE_DIR=${NNFORGE_CACHE_DIR:-/tmp/nnforge-gpu-cache}
PY=${PY:-python3}
JOBS=${JOBS:-$(nproc)}
DIRS="tests/core tests/codegen tests/control tests/nn tests/interop tests/passes tests/runtime tests/schedule"

STEPS=${STEPS:-render bench compile matrix whole_model cells rows transformer stalls streams precision modelview flashrnn sweep}
KEYS="triton${SELECT:+ and ($SELECT)}"

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.txt, say how it ended
    local name=$1 limit=$2
    [[ " $STEPS " == *" $name "* && " $SKIP " != *" $name "* ]] || return 0
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
}

SKIP=${SKIP:-}
if [[ ${PARALLEL:-0} == 1 ]]; then  # the timed steps alone, then the checks in three groups at once
    timed="tune bench compile cells rows wide stalls flashrnn sweep"
    SKIP="render matrix whole_model streams precision modelview" PARALLEL=0 "$0"
    # the matrix leaves four cores to the other groups (with all of them, the 2026-11-27 lease's render,
    # precision and ModelView steps ran out of their limits behind it)
    SKIP="$timed" STEPS="matrix" PARALLEL=0 JOBS=$((JOBS > 8 ? JOBS - 4 : JOBS)) "$0" >"$OUT/group-matrix.txt" 2>&1 &
    SKIP="$timed" STEPS="render whole_model modelview" PARALLEL=0 "$0" >"$OUT/group-render.txt" 2>&1 &
    SKIP="$timed" STEPS="precision streams" PARALLEL=0 "$0" >"$OUT/group-precision.txt" 2>&1 &
    wait
    cat "$OUT"/group-*.txt
    exit 0
fi

{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
    $PY -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton',
triton.__version__, torch.cuda.get_device_name())"
} >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

if [[ " $STEPS " == *" flashrnn "* ]] && ls gpu-wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --find-links gpu-wheels flashrnn >"$OUT/flashrnn-install.txt" 2>&1
fi

step tune "${TUNE_S:-300}" $PY -c "import nnforge.tune as t; print(t.tune_triton())"
tail -3 "$OUT/tune.txt" 2>/dev/null
step render "${RENDER_S:-120}" $PY -m pytest -q -p no:cacheprovider tests/codegen/triton
tail -3 "$OUT/render.txt" 2>/dev/null
# VARIANTS: nnforge also with these tiles or thresholds, interleaved (default: weight gradients summed over K in one
# program per tile of results, the form before parts; GEMM programs in the order before groups; large GEMMs in
# the small tiles, the form before Tiles.gemm_block; a host loop's steps in one launch of resident programs (at
# batch 128 and H = 384 each program holding its tile of the weights), and so with 16-column step tiles (H = 1024,
# batch 128: 2 x 64 tiles, each holding 128 KiB of weights); VARIANTS= for none)
VARIANTS=${VARIANTS-split_k_outputs=0 gemm_group=0 gemm_big_programs=0 resident_steps=1 resident_steps=1,gemm_n=16}
# shellcheck disable=SC2086  # BENCH and VARIANTS are lists of arguments
step bench "${BENCH_S:-300}" $PY bench/lstm_gpu.py --flashrnn none --cuda-graphs --profile \
    ${VARIANTS:+--variant $VARIANTS} ${BENCH:-}
cat "$OUT/bench.txt" 2>/dev/null
step compile "${COMPILE_S:-240}" $PY bench/compile_gpu.py --rounds "${COMPILE_ROUNDS:-1}"
cat "$OUT/compile.txt" 2>/dev/null
# shellcheck disable=SC2086
step matrix "${MATRIX_S:-300}" $PY -m pytest -q -p no:cacheprovider -n "$JOBS" --dist loadgroup -k "$KEYS" \
    -m "not timing and not whole_model" --maxfail=300 --junitxml="$OUT/matrix.xml" $DIRS
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/matrix.txt" 2>/dev/null | cut -c1-300 | tail -40
# shellcheck disable=SC2086
step whole_model "${WHOLE_S:-240}" $PY -m pytest -q -p no:cacheprovider -n 3 -k triton -m whole_model $DIRS tests/demo
tail -5 "$OUT/whole_model.txt" 2>/dev/null | cut -c1-300
# with the H = 96 layer's other forms beside the default, interleaved (CELL_VARIANTS): each row one padded tile,
# that tile transposed (the batch rows the MMA's N side), 8 warps a program, the input projection's programs in
# the order before groups, the projection computed in the scan kernel (its weights on chip too: 212 KiB of shared
# memory for sm_90); and the default's time by kernel (the projection GEMM against the scan)
CELL_VARIANTS=${CELL_VARIANTS-scan_pieces=0 scan_pieces=0,scan_transposed=1 scan_warps=8 gemm_group=0 chunk_bytes=65536}
# CUSTOM_VARIANTS: each custom cell also in these forms (a layer norm of the input projection before the scan;
# 8 warps a persistent program: the layer-norm LSTM's backward scan spills 340 bytes at 4, none at 8)
CUSTOM_VARIANTS=${CUSTOM_VARIANTS-hoist_step_work=1 scan_warps=8}
# shellcheck disable=SC2086  # CELLS is "BATCH HIDDEN", CELL_VARIANTS and CUSTOM_VARIANTS lists of arguments
step cells "${CELLS_S:-240}" $PY bench/lstm_gpu.py --mode inference --hidden 96 --batch 1024 --rounds 3 --profile \
    ${CELL_VARIANTS:+--variant $CELL_VARIANTS} --cells ${CELLS:-1024 96} \
    ${CUSTOM_VARIANTS:+--cell-variant $CUSTOM_VARIANTS}
grep -v "^T=\|^device" "$OUT/cells.txt" 2>/dev/null
# layer norms and softmaxes over rows as one kernel of whole rows, against the same programs with a kernel per
# reduction (row_programs=0), PyTorch's kernels and torch.compile; a projection and its layer norm as one kernel
# computing whole rows of the product, against the GEMM apart (gemm_row_programs=0) (bench/rows_gpu.py)
step rows "${ROWS_S:-240}" $PY bench/rows_gpu.py --rounds 5
cat "$OUT/rows.txt" 2>/dev/null
# a transformer encoder layer (d = 512, 8 heads, T = 500, batch 64, float16), inference and a training step,
# against torch's layer and torch.compile of it, nnforge's call by kernel (bench/transformer_gpu.py)
step transformer "${TRANSFORMER_S:-180}" $PY bench/transformer_gpu.py --rounds 10 --profile
cat "$OUT/transformer.txt" 2>/dev/null
# (opt-in, STEPS=wide) the widest batch, 64 rows per SM: at 8 rows a program 1056 programs, of which an
# H200 holds 264 at once (79 KiB of shared memory each), so four waves of all T steps; 16 rows make two
# (bench/scan_sass.py --rows: 87 KiB, 864 instructions a step for twice the rows)
# shellcheck disable=SC2086  # WIDE_VARIANTS is a list of arguments
step wide "${WIDE_S:-180}" $PY bench/lstm_gpu.py --mode inference --hidden 96 --batch 8448 --rounds 3 \
    --flashrnn none --variant ${WIDE_VARIANTS:-scan_rows=16 scan_rows=16,scan_warps=8}
cat "$OUT/wide.txt" 2>/dev/null
# where an LSTM step waits: Nsight Compute's stall reasons for each persistent scan kernel (inference, training
# forward and backward; the second call of each, inside the NVTX range "profiled"), with the tiles in use and,
# with STALLS="--variant ...", others. ncu reads counters on Firecracker machines only (device/KINDS.md); its
# clocks are left alone.
# shellcheck disable=SC2086  # STALLS is a list of arguments
step stalls "${STALLS_S:-150}" ncu --clock-control none --target-processes all --nvtx --nvtx-include "profiled/" \
    --kernel-name regex:scan --section WarpStateStats --section SchedulerStats --section Occupancy \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    $PY bench/scan_stalls_gpu.py ${STALLS:-}
grep -E "scan_|Stall|stalled|Warp Cycles|Issued Warp|Eligible|Active Warps|finite" "$OUT/stalls.txt" 2>/dev/null \
    | cut -c1-200 | head -120
step streams "${STREAMS_S:-240}" bash -c "$PY -m pytest -q -p no:cacheprovider tests/control/test_staging.py; t=\$?;
    $PY bench/feeder.py --backends cpu,triton --rounds 3 --steps 40 --trace $OUT/feeder-trace.json && exit \$t"
tail -12 "$OUT/streams.txt" 2>/dev/null
step precision "${PRECISION_S:-240}" $PY bench/precision_gpu.py
cat "$OUT/precision.txt" 2>/dev/null
step modelview "${MODELVIEW_S:-240}" $PY -m pytest -q -p no:cacheprovider tests/modelview/test_gpu.py
tail -5 "$OUT/modelview.txt" 2>/dev/null | cut -c1-300
step flashrnn "${FLASH_S:-300}" $PY bench/lstm_gpu.py --hidden 96 384 --batch 1024 --rounds 3 ${FLASH:-}
cat "$OUT/flashrnn.txt" 2>/dev/null
# SWEEP_FROM=path: the store of a run cut short (a lease's limit), continued into $OUT/gpu-sweep.db
[[ -n ${SWEEP_FROM:-} && " $STEPS " == *" sweep "* ]] && cp "$SWEEP_FROM" "$OUT/gpu-sweep.db"
step sweep "${SWEEP_S:-480}" $PY -c "import sys; from nnforge.modelview import sweep
r = sweep('scripts/gpu-sweep.toml', db=sys.argv[1], resume=True, progress=False)
print(r)" "$OUT/gpu-sweep.db"
tail -60 "$OUT/sweep.txt" 2>/dev/null | cut -c1-300
cat "$OUT/summary.txt"

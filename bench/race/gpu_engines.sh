#!/usr/bin/env bash
# The engines on a GPU machine in about 6 minutes, given a finished translate-de-en run:
# bench/race/gpu_decode.py (our decoder eager, compiled and as a CUDA graph, at batch 1 and 128, greedy and
# beam 5; CTranslate2 on CUDA only where it loads, a line saying why not otherwise), then
# bench/race/gpu_cli.sh on the run (predict and eval, eager and compiled, with the engine that decoded).
#   RUN=path/to/deen-run OUT=results bash bench/race/gpu_engines.sh
set -u
: "${RUN:?RUN=path/to/a/finished/translate-de-en/run}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TASKFORMER_CACHE=/tmp/tfcache TORCHINDUCTOR_CACHE_DIR=/tmp/ind
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
# Rows are written as they come: a run cut by the timeout keeps what it measured.
timeout ${DECODE_TIMEOUT:-240} python3 bench/race/gpu_decode.py --n1 32 --n128 512 --rounds 2 --out "$OUT/gpu_decode.json" 2>&1 | grep -v '^ *"' | tail -40
echo "gpu_decode exit: ${PIPESTATUS[0]}"
RUN="$RUN" OUT="$OUT" timeout ${CLI_TIMEOUT:-150} bash bench/race/gpu_cli.sh 2>&1 | tail -40
echo "gpu_cli exit: ${PIPESTATUS[0]}"

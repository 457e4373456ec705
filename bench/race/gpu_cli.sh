#!/usr/bin/env bash
# The CLI end to end on a GPU machine: install without dependencies (the machine has its own torch),
# train translate-de-en for MINUTES minutes (or take the finished run RUN), then predict and evaluate
# eager and with the compiled step, each saying which engine decoded.
#   DATA=path/to/multi30k MINUTES=6 OUT=results bash bench/race/gpu_cli.sh
#   RUN=path/to/finished-run OUT=results bash bench/race/gpu_cli.sh      # no training
export PYTHONUNBUFFERED=1 TASKFORMER_CACHE=${TASKFORMER_CACHE:-/tmp/tfcache} TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ind}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S="Ein Mann fährt mit dem Fahrrad durch die Stadt."
nvidia-smi --query-gpu=name --format=csv,noheader
if [ -z "${RUN:-}" ]; then
  RUN=/tmp/r/deen
  timeout ${TRAIN_TIMEOUT:-480} taskformer run translate-de-en --data-dir ${DATA:-.gpu/multi30k} --time-limit ${MINUTES:-6} --out $RUN 2>&1 | tail -40
  cp $RUN/result.json "$OUT/result.json"; cp $RUN/report.txt "$OUT/report.txt"
fi
for flag in false true; do
  TIMEFORMAT="predict compile=$flag: %R s"; time taskformer predict "$RUN" --json --set decode.compile=$flag "$S"
  TIMEFORMAT="eval compile=$flag: %R s"; time taskformer eval "$RUN" --split test --set decode.compile=$flag --json > "$OUT/eval-compile-$flag.json"
  cat "$OUT/eval-compile-$flag.json"
done

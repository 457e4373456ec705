#!/usr/bin/env bash
# The CLI end to end on a GPU machine: install without dependencies (the machine has its own torch),
# train translate-de-en for MINUTES minutes, then predict and evaluate eager and with the compiled step.
#   DATA=path/to/multi30k MINUTES=2 OUT=results bash bench/race/gpu_cli.sh
export PYTHONUNBUFFERED=1 TASKFORMER_CACHE=/tmp/tfcache TORCHINDUCTOR_CACHE_DIR=/tmp/ind
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
R=/tmp/r; S="Ein Mann fährt mit dem Fahrrad durch die Stadt."
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${TRAIN_TIMEOUT:-240} taskformer run translate-de-en --data-dir ${DATA:-.gpu/multi30k} --time-limit ${MINUTES:-2} --out $R/deen 2>&1 | tail -40
cp $R/deen/result.json $OUT/result.json; cp $R/deen/report.txt $OUT/report.txt
for flag in false true; do
  TIMEFORMAT="predict compile=$flag: %R s"; time taskformer predict $R/deen --set decode.compile=$flag "$S"
  TIMEFORMAT="eval compile=$flag: %R s"; time taskformer eval $R/deen --split test --set decode.compile=$flag --json > $OUT/eval-compile-$flag.json
  cat $OUT/eval-compile-$flag.json
done

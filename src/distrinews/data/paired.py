"""A multi-label data set made from a single-label one: pairs of stories joined into one text, with both labels.

No multi-label news set ships with the project, so tests and the multi-label benchmark use this: each row is one
story with its label, or two stories of different labels joined with a space, carrying both; every story is used
once. A fair test of the machinery (a model must find each topic wherever it sits, and say how many), not a stand-in
for stories that cover several topics: a joined pair has a seam, and always one or two labels.

    python -m distrinews.data.paired --data DIR --split train --output pairs-train.jsonl
    python -m distrinews.data.paired --train-file mine.csv --label-column-name topic --output pairs.jsonl

writes JSONL rows ``{"text": ..., "labels": [names]}``, which ``problem_type: multi_label_classification``
with ``label_column_name: labels`` trains on.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import DataError
from .rows import AG_NEWS_LABELS, RawSplit

PAIR_SHARE = 0.5  # of the output rows, the share that are pairs


def paired_rows(
    split: RawSplit, label_names: Sequence[str], pair_share: float = PAIR_SHARE, seed: int = 0
) -> list[dict[str, Any]]:
    """``{"text", "labels"}`` rows from ``split``'s stories in a seeded order: about ``pair_share`` of the rows are
    two stories of different labels joined (both labels, in id order), the rest one story (its label)."""
    if not 0 <= pair_share <= 1:
        raise ValueError(f"pair_share must be from 0 to 1, not {pair_share}")
    order = list(range(len(split)))
    rng = random.Random(seed)
    rng.shuffle(order)
    waiting: list[int] = []  # stories passed over while looking for a partner of another label
    rows: list[dict[str, Any]] = []
    queue = iter(order)
    for i in queue:  # each story drawn here starts a row: a pair with probability pair_share (it draws its partner)
        if rng.random() >= pair_share:
            rows.append(_row(split, label_names, [i]))
            continue
        partner = next((j for j in waiting if split.labels[j] != split.labels[i]), None)
        if partner is not None:
            waiting.remove(partner)
        else:
            for j in queue:
                if split.labels[j] != split.labels[i]:
                    partner = j
                    break
                waiting.append(j)
        rows.append(_row(split, label_names, [i] if partner is None else [i, partner]))
    rows += [_row(split, label_names, [j]) for j in waiting]
    return rows


def _row(split: RawSplit, label_names: Sequence[str], stories: list[int]) -> dict[str, Any]:
    ids = sorted({split.labels[i] for i in stories})
    return {"text": " ".join(split.texts[i] for i in stories), "labels": [label_names[i] for i in ids]}


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    out = Path(path)
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return out


def _read(args: argparse.Namespace) -> tuple[RawSplit, list[str]]:
    if args.train_file is None:
        from .splits import load_split

        return load_split(args.data, args.split), list(AG_NEWS_LABELS)
    from .labelled import _labelled, label_set, names_in, read_file_rows

    rows = read_file_rows(args.train_file, "train_file", names_in(args.text_column_names), [args.label_column_name])
    names, to_id = label_set(rows, None, [])
    return _labelled(rows, to_id, names, "the input"), names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distrinews.data.paired", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="the JSONL file to write")
    parser.add_argument("--data", default=None, help="AG News's folder (default $DISTRINEWS_DATA)")
    parser.add_argument("--split", choices=("train", "test"), default="train", help="AG News's split")
    parser.add_argument("--train-file", default=None, help="a single-label CSV/JSONL/Parquet file instead of AG News")
    parser.add_argument("--text-column-names", default="text")
    parser.add_argument("--label-column-name", default="label")
    parser.add_argument("--pair-share", type=float, default=PAIR_SHARE, help="share of the rows that are pairs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        split, names = _read(args)
    except DataError as exc:
        parser.exit(2, f"error: {exc}\n")
    rows = paired_rows(split, names, args.pair_share, args.seed)
    write_jsonl(rows, args.output)
    pairs = sum(len(row["labels"]) == 2 for row in rows)
    print(f"{args.output}: {len(rows):,} rows ({pairs:,} pairs of stories, {len(rows) - pairs:,} single stories)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

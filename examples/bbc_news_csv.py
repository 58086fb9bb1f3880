"""Turn the BBC News file in AG News form (no header; class 2/3/4, title, description) into a labelled CSV
as a newsroom would have it: a header, and the desk's name as the label.

    python examples/bbc_news_csv.py ../shared/data/bbc_news/test.csv.gz data/bbc_news.csv

Then train on it as on any data set of your own (README.md, "Your own data").
"""

import csv
import gzip
import sys
from pathlib import Path

DESKS = {"2": "sport", "3": "business", "4": "tech"}  # the AG News classes the BBC file uses, by BBC's names


def main(source: str, target: str) -> None:
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if source.endswith(".gz") else open
    with (
        opener(source, "rt", encoding="utf-8", newline="") as fin,
        open(target, "w", encoding="utf-8", newline="") as fout,
    ):
        writer = csv.writer(fout)
        writer.writerow(["headline", "summary", "desk"])
        rows = 0
        for klass, title, description in csv.reader(fin):
            writer.writerow([title, description, DESKS[klass]])
            rows += 1
    print(f"wrote {rows:,} rows to {target}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

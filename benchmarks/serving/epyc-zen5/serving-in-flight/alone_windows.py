"""The runtime alone (as bench serving measures it) with windows of the batcher's whole lookahead against windows of
the 32 texts 32 clients keep in flight, alternated: texts/s at each batch size."""

import json
import os
import sys

from distrinews.bench.serving_limit import runtime_alone
from distrinews.bench.serving_load import load_texts

checkpoint, rounds = sys.argv[1], int(sys.argv[2])
texts, _ = load_texts(os.environ["DISTRINEWS_DATA"], 2000)  # bench serving's default --texts
for r in range(rounds):
    for in_flight in (None, 32):
        alone = runtime_alone(checkpoint, "auto", texts, 10.0, None, 32, 512, in_flight=in_flight)
        rates = json.dumps({k: round(v, 1) for k, v in alone["texts_per_s"].items()})
        print(f"round {r} window {'4 x batch' if in_flight is None else 'in flight 32'}: {rates}", flush=True)

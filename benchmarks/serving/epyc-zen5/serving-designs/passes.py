"""Texts/s of the int8 runtime: one pass at a time on all cores, against N concurrent single-threaded passes."""

import os
import sys
import threading
import time

from distrinews.bench.serving_load import load_texts
from distrinews.predict.batch_forming import plan_passes
from distrinews.predict.runtimes import make_predictor

ckpt = sys.argv[1]
texts, _ = load_texts(os.environ["DISTRINEWS_DATA"], 2048)
DUR = float(sys.argv[2]) if len(sys.argv) > 2 else 8


def run(predictor, size, start, counter, stop):
    window = 4 * size
    i = start
    while time.perf_counter() < stop:
        chunk = [texts[(i + k) % len(texts)] for k in range(window)]
        i += window * 7
        enc = predictor.encode(chunk)
        for idx in plan_passes([len(e) for e in enc], size, None):
            predictor.predict_encoded([enc[k] for k in idx])
        counter.append(len(chunk))


def measure(label, predictors, size):
    stop = time.perf_counter() + DUR
    counts = [[] for _ in predictors]
    t0 = time.perf_counter()
    ths = [threading.Thread(target=run, args=(p, size, 97 * j, counts[j], stop)) for j, p in enumerate(predictors)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    el = time.perf_counter() - t0
    print(f"{label:40s} batch {size:3d}: {sum(map(sum, counts)) / el:7.1f} texts/s", flush=True)


for _round in range(2):
    for spin in (False, True):
        one = make_predictor(ckpt, runtime="onnx-int8", spin=spin)
        one.warmup()
        shared1 = make_predictor(ckpt, runtime="onnx-int8", threads=1, spin=spin)
        shared1.warmup()
        for size in (16, 32):
            measure(f"1 pass x 2 threads spin={spin}", [one], size)
            measure(f"2 passes x 1 thread, one session spin={spin}", [shared1, shared1], size)
        del one, shared1

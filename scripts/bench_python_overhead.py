"""Per-run cost of calling a model from Python: kiln against onnxruntime on the zoo's mlp
(a 784-256-10 MLP, about 0.4 MFLOP: the call's fixed cost dominates), same input, both on
the CPU with 2 threads, runs alternated in rounds. Prints microseconds per run.

    python scripts/bench_python_overhead.py [--zoo DIR] [--runs N] [--rounds R]
"""
import argparse
import os
import pathlib
import statistics
import time

import numpy as np
import onnxruntime as ort

import kiln


def per_run_us(fn, runs):
    t = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t) / runs * 1e6


def main():
    here = pathlib.Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser()
    p.add_argument("--zoo", default=os.environ.get("KILN_ZOO", here.parent / "shared" / "zoo"))
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    model = str(pathlib.Path(a.zoo) / "mlp" / "model.onnx")
    x = np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)
    k = kiln.Session(model, device="cpu", threads=2)
    o = ort.SessionOptions()
    o.intra_op_num_threads = 2
    r = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(k.run(None, {"x": x})[0], r.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    kiln_us, ort_us = [], []
    for _ in range(a.rounds):
        kiln_us.append(per_run_us(lambda: k.run(None, {"x": x}), a.runs))
        ort_us.append(per_run_us(lambda: r.run(None, {"x": x}), a.runs))
    km, om = statistics.median(kiln_us), statistics.median(ort_us)
    print(f"mlp, CPU, 2 threads, {a.rounds} rounds of {a.runs} runs each (per run, microseconds)")
    print(f"kiln        median {km:8.1f}  min {min(kiln_us):8.1f}")
    print(f"onnxruntime median {om:8.1f}  min {min(ort_us):8.1f}")
    print(f"kiln - onnxruntime: median {km - om:+.1f} us, min {min(kiln_us) - min(ort_us):+.1f} us")


if __name__ == "__main__":
    main()

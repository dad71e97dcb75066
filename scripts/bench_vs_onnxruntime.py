#!/usr/bin/env python3
"""Kiln against onnxruntime on the same machine, in the same command.

For each zoo model: `kiln bench --json` (CPU, and the GPU with --gpu) on one data set
of the model (--data-set, default the first), and onnxruntime's CPU session (graph optimisations on,
intra_op_num_threads=2, the same inputs), median of the same number of runs.

Usage: scripts/bench_vs_onnxruntime.py [--iters N] [--gpu] [--compare-passes] [--data-set N] [--kiln PATH] [MODEL ...]
Prints a table and, with --json, one JSON object.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODELS = ["resnet18", "mobilenet_v2", "squeezenet1_1"]


def inputs_of(model_dir, data_set=0):
    ds = os.path.join(model_dir, f"test_data_set_{data_set}")
    files = sorted(f for f in os.listdir(ds) if f.startswith("input_"))
    out = []
    for f in files:
        t = onnx.TensorProto()
        with open(os.path.join(ds, f), "rb") as fh:
            t.ParseFromString(fh.read())
        out.append((t.name, os.path.join(ds, f), numpy_helper.to_array(t)))
    return out


def bench_ort(model, feeds, iters, warmup):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bench_kiln(kiln, model, inputs, device, iters, warmup, extra=()):
    cmd = [kiln, "bench", model, "--device", device, "--iters", str(iters), "--warmup", str(warmup), "--json", *extra]
    for name, path, _ in inputs:
        cmd += ["-i", f"{name}={path}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--gpu", action="store_true", help="also bench kiln on the GPU (lavapipe here)")
    ap.add_argument("--gpu-iters", type=int, default=3)
    ap.add_argument("--kiln", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "kiln"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--data-set", type=int, default=0, help="which test_data_set_N of each model to feed")
    ap.add_argument("--compare-passes", action="store_true",
                    help="also run kiln without its graph passes (before/after fusion)")
    args = ap.parse_args()
    zoo = os.environ.get("KILN_ZOO", os.path.join(ROOT, "..", "shared", "zoo"))
    rows = []
    for m in args.models:
        d = os.path.join(zoo, m)
        model = os.path.join(d, "model.onnx")
        inputs = inputs_of(d, args.data_set)
        feeds = {n: a for n, _, a in inputs}
        ort_ms = bench_ort(model, feeds, args.iters, args.warmup)
        k = bench_kiln(args.kiln, model, inputs, "cpu", args.iters, args.warmup)
        row = {"model": m, "ort_cpu_ms": ort_ms, "kiln_cpu_ms": k["median_ms"], "ratio": k["median_ms"] / ort_ms,
               "kiln_cpu_kernels": k["kernels_per_run"], "kiln_cpu_memory": k.get("memory")}
        if args.compare_passes:
            k0 = bench_kiln(args.kiln, model, inputs, "cpu", args.iters, args.warmup, ["--no-passes"])
            row.update({"kiln_cpu_ms_no_passes": k0["median_ms"], "kiln_cpu_kernels_no_passes": k0["kernels_per_run"]})
        if args.gpu:
            g = bench_kiln(args.kiln, model, inputs, "gpu", args.gpu_iters, 1)
            row.update({"kiln_gpu_ms": g["median_ms"], "gpu_device": g["device"], "gpu_submits": g["submits_per_run"],
                        "gpu_kernels": g["kernels_per_run"]})
            if args.compare_passes:
                g0 = bench_kiln(args.kiln, model, inputs, "gpu", args.gpu_iters, 1, ["--no-passes"])
                row.update({"kiln_gpu_ms_no_passes": g0["median_ms"], "gpu_kernels_no_passes": g0["kernels_per_run"]})
        rows.append(row)
        if not args.json:
            line = f"{m:14} onnxruntime {ort_ms:8.2f} ms   kiln cpu {k['median_ms']:8.2f} ms   ratio {row['ratio']:5.2f}x"
            if args.compare_passes:
                line += f" ({row['kiln_cpu_kernels']} kernels; without passes {row['kiln_cpu_ms_no_passes']:.2f} ms, {row['kiln_cpu_kernels_no_passes']} kernels)"
            if args.gpu:
                line += f"   kiln gpu {row['kiln_gpu_ms']:9.1f} ms ({row['gpu_submits']} submit/run, {row['gpu_kernels']} kernels)"
                if args.compare_passes:
                    line += f" (without passes {row['kiln_gpu_ms_no_passes']:.1f} ms, {row['gpu_kernels_no_passes']} kernels)"
            print(line, flush=True)
    if args.json:
        print(json.dumps({"onnxruntime": ort.__version__, "rows": rows}))


if __name__ == "__main__":
    sys.exit(main())

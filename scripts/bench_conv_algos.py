#!/usr/bin/env python3
"""The blocked 3x3 convolution's algorithms shape by shape: direct against Winograd.

For each shape it writes a small model (a 1x1 convolution, so that the 3x3 one reads
a blocked input, then the 3x3 convolution with bias and Relu; or a chain of N of them
with --chain N, the first CIN -> COUT, the others COUT -> COUT) and times it with `kiln bench --profile`, forcing each algorithm in
turn (`KILN_FORCE_TUNE=algo=0` direct, `algo=1` Winograd F(4x4, 3x3)) and alternating
them over --rounds. Prints the median milliseconds per run of the 3x3 convolutions
(their mean in a chain), each algorithm's and their ratio, and which one Kiln's
default picks (`default`: the plain run's time next to the two).

Usage:
  scripts/bench_conv_algos.py [--kiln PATH] [--threads N] [--rounds N] [--chain N]
      [SHAPE ...]          SHAPE = CIN:COUT:SIZE, e.g. 64:64:56 (default: ResNet-18's
                           and SqueezeNet's 3x3 layers)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DEFAULT_SHAPES = ["64:64:56", "128:128:28", "256:256:14", "512:512:7", "16:64:55", "32:128:27", "48:192:13", "64:256:13"]


def write_model(path, cin, cout, size, chain):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((cin, cin, 1, 1)) * 0.1).astype(np.float32), "w0")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a0"], name="pointwise")]
    c = cin
    for i in range(chain):
        w = (rng.standard_normal((cout, c, 3, 3)) * (1.0 / np.sqrt(9 * c))).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i + 1}"), numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i + 1}")]
        nodes += [
            helper.make_node("Conv", [f"a{i}", f"w{i + 1}", f"b{i + 1}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv3x3_{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"a{i + 1}"]),
        ]
        c = cout
    graph = helper.make_graph(nodes, "conv_algos", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info(f"a{chain}", TensorProto.FLOAT, [1, cout, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def conv_ms(kiln, path, threads, force):
    env = dict(os.environ)
    env.pop("KILN_FORCE_TUNE", None)
    if force is not None:
        env["KILN_FORCE_TUNE"] = f"algo={force}"
    out = subprocess.run([kiln, "bench", path, "--device", "cpu", "--threads", str(threads), "--profile", "--json", "--no-tuning"],
                         capture_output=True, text=True, env=env, check=True).stdout
    times = [p["ms"] for p in json.loads(out)["profile"] if re.fullmatch(r"conv3x3_\d+", p["node"])]
    return sum(times) / len(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "kiln"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chain", type=int, default=1, help="3x3 convolutions in a row (their weights then compete for the caches)")
    a = ap.parse_args()
    print(f"{'shape (cin:cout:size)':22} {'direct ms':>10} {'winograd ms':>12} {'direct/wino':>12} {'default ms':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes:
            cin, cout, size = (int(v) for v in shape.split(":"))
            path = os.path.join(tmp, f"{cin}_{cout}_{size}.onnx")
            write_model(path, cin, cout, size, a.chain)
            runs = {0: [], 1: [], None: []}
            for _ in range(a.rounds):
                for force in runs:
                    runs[force].append(conv_ms(a.kiln, path, a.threads, force))
            d, w, x = (statistics.median(runs[k]) for k in (0, 1, None))
            print(f"{shape:22} {d:10.3f} {w:12.3f} {d / w:11.2f}x {x:11.3f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Development aid: dumps the ONNX backend node tests of the nn ops into a plain text
format that the ignored test `nn::node_tests::onnx_node_tests` reads, so the CPU
kernels can be checked against the official expectations without an ONNX importer.

Usage: python3 dump_node_tests.py /work/onnx-node-tests /tmp/nn-node-cases
       KILN_NN_CASES=/tmp/nn-node-cases cargo test -p kiln-ops --release onnx_node_tests -- --ignored
"""
import glob
import os
import sys

import onnx
from onnx import numpy_helper

PREFIXES = ("test_conv_", "test_convtranspose", "test_maxpool", "test_averagepool", "test_globalaveragepool",
            "test_globalmaxpool", "test_batchnorm", "test_instancenorm", "test_lppool")
DTYPES = {"float32": "f32", "float64": "f64", "uint8": "u8", "int8": "i8", "int64": "i64"}


def tensor_line(kind, arr):
    dims = ",".join(str(d) for d in arr.shape) or "-"
    vals = " ".join(repr(float(v)) if arr.dtype.kind == "f" else str(int(v)) for v in arr.flatten())
    return f"{kind} {DTYPES[str(arr.dtype)]} {dims} {vals}\n"


def main(src, dst):
    os.makedirs(dst, exist_ok=True)
    for d in sorted(glob.glob(os.path.join(src, "test_*"))):
        name = os.path.basename(d)
        if not name.startswith(PREFIXES) or "convinteger" in name:
            continue
        model = onnx.load(os.path.join(d, "model.onnx"))
        node = model.graph.node[0]
        lines = [f"op {node.op_type}\n", f"opset {model.opset_import[0].version}\n", f"outputs {len(node.output)}\n"]
        for a in node.attribute:
            v = onnx.helper.get_attribute_value(a)
            if isinstance(v, bytes):
                lines.append(f"attr {a.name} string {v.decode()}\n")
            elif isinstance(v, int):
                lines.append(f"attr {a.name} int {v}\n")
            elif isinstance(v, float):
                lines.append(f"attr {a.name} float {v!r}\n")
            elif isinstance(v, list) and all(isinstance(x, int) for x in v):
                lines.append(f"attr {a.name} ints {' '.join(map(str, v))}\n")
            else:
                lines.append(f"attr {a.name} floats {' '.join(map(repr, v))}\n")
        case = os.path.join(d, "test_data_set_0")
        inputs = sorted(glob.glob(os.path.join(case, "input_*.pb")), key=lambda p: int(p.split("_")[-1][:-3]))
        outputs = sorted(glob.glob(os.path.join(case, "output_*.pb")), key=lambda p: int(p.split("_")[-1][:-3]))
        for kind, files in (("in", inputs), ("out", outputs)):
            for f in files:
                t = onnx.TensorProto()
                with open(f, "rb") as fh:
                    t.ParseFromString(fh.read())
                lines.append(tensor_line(kind, numpy_helper.to_array(t)))
        with open(os.path.join(dst, name + ".txt"), "w") as fh:
            fh.writelines(lines)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

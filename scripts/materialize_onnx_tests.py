#!/usr/bin/env python3
"""Writes the ONNX backend node tests that ship (as generators) with the onnx wheel
into DIR/<test_name>/{model.onnx, test_data_set_N/{input,output}_I.pb, meta.json}.

Usage: materialize_onnx_tests.py DIR
Idempotent: skips the work when DIR/.complete names the same onnx version.
"""
import json
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node


def to_proto(value, name):
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return numpy_helper.from_array(np.asarray(value), name)
    return None  # sequences, optionals, maps: not tensors


def main():
    out = sys.argv[1]
    stamp = os.path.join(out, ".complete")
    if os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        print(f"ONNX node tests already in {out} (onnx {onnx.__version__})")
        return
    os.makedirs(out, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    written = 0
    for case in cases:
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        onnx.save(case.model, os.path.join(d, "model.onnx"))
        graph = case.model.graph
        init = {i.name for i in graph.initializer}
        in_names = [i.name for i in graph.input if i.name not in init]
        out_names = [o.name for o in graph.output]
        non_tensor = False
        for k, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{k}")
            os.makedirs(ds, exist_ok=True)
            for kind, names, values in (("input", in_names, inputs), ("output", out_names, outputs)):
                for i, v in enumerate(values):
                    p = to_proto(v, names[i] if i < len(names) else f"{kind}_{i}")
                    if p is None:
                        non_tensor = True
                        continue
                    with open(os.path.join(ds, f"{kind}_{i}.pb"), "wb") as f:
                        f.write(p.SerializeToString())
        ops = sorted({n.op_type for n in graph.node})
        meta = {"rtol": case.rtol, "atol": case.atol, "ops": ops, "non_tensor": non_tensor,
                "opset": {o.domain or "ai.onnx": o.version for o in case.model.opset_import}}
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        written += 1
    with open(stamp, "w") as f:
        f.write(onnx.__version__)
    print(f"wrote {written} ONNX node tests to {out}")


if __name__ == "__main__":
    main()

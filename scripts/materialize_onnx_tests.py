#!/usr/bin/env python3
"""Writes the ONNX backend node tests that ship (as generators) with the onnx wheel
into DIR/<test_name>/{model.onnx, test_data_set_N/{input,output}_I.pb, meta.json}.
Each .pb holds the kind of value the model declares for it: a TensorProto, or a
SequenceProto / OptionalProto (meta.json's "non_tensor" says the test has such values).

Usage: materialize_onnx_tests.py DIR
Each meta.json names the op the test is about ("op": the single op of the model, or for
an "_expanded" test (the op's function body) the op of its unexpanded sibling), and
DIR/onnx_ops.json lists every operator the onnx package defines (for docs/ops.md).
Idempotent: skips the work when DIR/.complete names the same onnx version and format.
"""
FORMAT = "4"  # bump when the layout of what is written changes
import json
import os
import re
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node


def to_proto(value, name, ty=None):
    """`value` as the proto its declared type `ty` (an onnx.TypeProto) calls for."""
    kind = ty.WhichOneof("value") if ty is not None else None
    if kind == "sequence_type":
        return sequence_proto([to_proto(v, "", ty.sequence_type.elem_type) for v in value], name)
    if kind == "optional_type":
        inner = ty.optional_type.elem_type
        p = onnx.OptionalProto()
        p.name = name
        if inner.WhichOneof("value") == "sequence_type":
            p.elem_type = onnx.OptionalProto.SEQUENCE
            if value is not None:
                p.sequence_value.CopyFrom(to_proto(value, "", inner))
        else:
            p.elem_type = onnx.OptionalProto.TENSOR
            if value is not None:
                p.tensor_value.CopyFrom(to_proto(value, "", inner))
        return p
    if isinstance(value, list):  # an undeclared sequence
        return sequence_proto([to_proto(v, "") for v in value], name)
    if isinstance(value, onnx.TensorProto):  # tests of exotic dtypes give protos directly
        p = onnx.TensorProto()
        p.CopyFrom(value)
        p.name = name
        return p
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return numpy_helper.from_array(np.asarray(value), name)
    return None  # maps: not supported


def sequence_proto(tensors, name):
    p = onnx.SequenceProto()
    p.name = name
    p.elem_type = onnx.SequenceProto.TENSOR
    p.tensor_values.extend(tensors)
    return p


def main():
    out = sys.argv[1]
    stamp = os.path.join(out, ".complete")
    version = f"{onnx.__version__} format {FORMAT}"
    if os.path.exists(stamp) and open(stamp).read().strip() == version:
        print(f"ONNX node tests already in {out} (onnx {onnx.__version__})")
        return
    os.makedirs(out, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    single_op = {c.name: c.model.graph.node[0] for c in cases if len({n.op_type for n in c.model.graph.node}) == 1}
    written = 0
    for case in cases:
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        onnx.save(case.model, os.path.join(d, "model.onnx"))
        graph = case.model.graph
        init = {i.name for i in graph.initializer}
        ins = [i for i in graph.input if i.name not in init]
        in_names = [i.name for i in ins]
        out_names = [o.name for o in graph.output]
        types = {"input": [i.type for i in ins], "output": [o.type for o in graph.output]}
        non_tensor = False
        for k, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{k}")
            os.makedirs(ds, exist_ok=True)
            for kind, names, values in (("input", in_names, inputs), ("output", out_names, outputs)):
                for i, v in enumerate(values):
                    ty = types[kind][i] if i < len(types[kind]) else None
                    if ty is not None and ty.WhichOneof("value") != "tensor_type" or isinstance(v, list):
                        non_tensor = True
                    p = to_proto(v, names[i] if i < len(names) else f"{kind}_{i}", ty)
                    if p is None:
                        continue
                    with open(os.path.join(ds, f"{kind}_{i}.pb"), "wb") as f:
                        f.write(p.SerializeToString())
        ops = sorted({n.op_type for n in graph.node})
        subject = single_op.get(re.sub(r"_expanded(_ver\d+)?$", "", case.name)) or single_op.get(case.name)
        op = None
        if subject is not None:
            op = subject.op_type if subject.domain in ("", "ai.onnx") else f"{subject.domain}.{subject.op_type}"
        meta = {"rtol": case.rtol, "atol": case.atol, "ops": ops, "op": op, "non_tensor": non_tensor,
                "opset": {o.domain or "ai.onnx": o.version for o in case.model.opset_import}}
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        written += 1
    latest = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        key = (schema.domain or "ai.onnx", schema.name)
        if key not in latest or schema.since_version > latest[key].since_version:
            latest[key] = schema
    catalog = [{"domain": d, "op": n, "since_version": s.since_version, "deprecated": s.deprecated}
               for (d, n), s in sorted(latest.items())]
    with open(os.path.join(out, "onnx_ops.json"), "w") as f:
        json.dump(catalog, f)
    with open(stamp, "w") as f:
        f.write(version)
    print(f"wrote {written} ONNX node tests to {out}")


if __name__ == "__main__":
    main()

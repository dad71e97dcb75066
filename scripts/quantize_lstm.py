#!/usr/bin/env python3
"""Writes onnxruntime's dynamically quantized versions of the zoo's lstm_tagger, for the
zoo test `lstm_tagger_ort_quantized` (tests/zoo.rs): onnxruntime's quantization tool
(`quantize_dynamic`) turns each LSTM into com.microsoft DynamicQuantizeLSTM with int8
W and R, scaled per direction, and with `--per-channel`'s variant per column.
onnxruntime's own outputs on the zoo's inputs are the references. The weights use
`reduce_range` (7 bits): on x86 without VNNI, onnxruntime's u8 x s8 kernel sums byte
pairs in saturating 16-bit lanes (`vpmaddubsw`), which full-range int8 weights overflow
(its outputs then sit 4e-2 from the exact arithmetic on lstm_tagger); with 7-bit
weights its products are exact on every CPU, so the references are the spec's
arithmetic wherever they were written. The session runs one thread: onnxruntime
quantizes the hidden state per group of batch rows, one group per thread (with
batch > 4, or >= 2 rows and hidden <= 256), so its results depend on its thread count;
with one thread the group is the whole batch, as Kiln quantizes it.

    python3 scripts/quantize_lstm.py [OUT_DIR]

OUT_DIR defaults to $KILN_OPTIMIZED_ZOO, else .cache/optimized-zoo; the zoo is read from
$KILN_ZOO, else ../shared/zoo. Writes OUT_DIR/NAME/model.onnx and
OUT_DIR/NAME/test_data_set_N/{input,output}_K.pb for NAME lstm_tagger_int8_dyn and
lstm_tagger_int8_dyn_per_channel, and dq_lstm_sequence_lens: one bidirectional
DynamicQuantizeLSTM node with 7-bit random weights, an initial state and
sequence_lens shorter than the sequence (rows that end early change what onnxruntime
quantizes in the later steps).
"""
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = [("lstm_tagger_int8_dyn", False), ("lstm_tagger_int8_dyn_per_channel", True)]


def main():
    logging.getLogger().setLevel(logging.ERROR)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KILN_OPTIMIZED_ZOO", ROOT / ".cache/optimized-zoo"))
    zoo = Path(os.environ.get("KILN_ZOO", ROOT.parent / "shared/zoo"))
    src = zoo / "lstm_tagger"
    if not (src / "model.onnx").exists():
        sys.exit(f"{src / 'model.onnx'} is missing: set KILN_ZOO to the model zoo")
    for name, per_channel in VARIANTS:
        dst = out / name
        model = dst / "model.onnx"
        if model.exists() and model.stat().st_mtime >= (src / "model.onnx").stat().st_mtime and (dst / "test_data_set_0").is_dir():
            continue
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        quantize_dynamic(str(src / "model.onnx"), str(model), op_types_to_quantize=["LSTM"], weight_type=QuantType.QInt8, per_channel=per_channel, reduce_range=True)
        ops = sorted({n.op_type for n in onnx.load(str(model)).graph.node})
        assert "DynamicQuantizeLSTM" in ops, f"{name}: onnxruntime wrote no DynamicQuantizeLSTM ({ops})"
        n_inputs = len(ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs())
        sets = [[numpy_helper.to_array(onnx.load_tensor(str(ds / f"input_{k}.pb"))) for k in range(n_inputs)] for ds in sorted(src.glob("test_data_set_*"))]
        write_sets(dst, model, sets)
        print(f"{name}: {model} ({', '.join(ops)})")
    sequence_lens_case(out)


def write_sets(dst, model, sets):
    """Runs `model` with one onnxruntime thread on each input list of `sets` and writes
    the inputs and outputs as test_data_set_N."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    for n, inputs in enumerate(sets):
        results = sess.run(None, dict(zip(names, inputs)))
        ds = dst / f"test_data_set_{n}"
        ds.mkdir()
        for kind, vals, labels in (("input", inputs, names), ("output", results, outs)):
            for k, (v, label) in enumerate(zip(vals, labels)):
                with open(ds / f"{kind}_{k}.pb", "wb") as f:
                    f.write(numpy_helper.from_array(v, label).SerializeToString())


def sequence_lens_case(out):
    dst = out / "dq_lstm_sequence_lens"
    if (dst / "test_data_set_0").is_dir():
        return
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    rng = np.random.default_rng(12)
    seq, batch, inp, hid, dirs = 6, 4, 5, 8, 2
    w = rng.integers(-63, 64, (dirs, inp, 4 * hid)).astype(np.int8)
    r = rng.integers(-63, 64, (dirs, hid, 4 * hid)).astype(np.int8)
    b = (rng.standard_normal((dirs, 8 * hid)) * 0.1).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(r, "R"),
        numpy_helper.from_array(b, "B"),
        numpy_helper.from_array(np.array([0.011, 0.013], np.float32), "W_scale"),
        numpy_helper.from_array(np.zeros(dirs, np.int8), "W_zero_point"),
        numpy_helper.from_array(np.array([0.021, 0.017], np.float32), "R_scale"),
        numpy_helper.from_array(np.zeros(dirs, np.int8), "R_zero_point"),
    ]
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "", "W_scale", "W_zero_point", "R_scale", "R_zero_point"],
        ["Y", "Y_h", "Y_c"],
        domain="com.microsoft",
        hidden_size=hid,
        direction="bidirectional",
    )
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "dq_lstm_sequence_lens",
        [
            helper.make_tensor_value_info("X", f32, [seq, batch, inp]),
            helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [batch]),
            helper.make_tensor_value_info("initial_h", f32, [dirs, batch, hid]),
            helper.make_tensor_value_info("initial_c", f32, [dirs, batch, hid]),
        ],
        [helper.make_tensor_value_info(n, f32, None) for n in ("Y", "Y_h", "Y_c")],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(dst / "model.onnx"))
    sets = []
    for lens in ([6, 2, 4, 1], [3, 6, 0, 5]):
        sets.append([
            rng.standard_normal((seq, batch, inp)).astype(np.float32),
            np.array(lens, np.int32),
            (rng.standard_normal((dirs, batch, hid)) * 2).astype(np.float32),
            rng.standard_normal((dirs, batch, hid)).astype(np.float32),
        ])
    write_sets(dst, dst / "model.onnx", sets)
    print(f"dq_lstm_sequence_lens: {dst / 'model.onnx'}")


if __name__ == "__main__":
    main()

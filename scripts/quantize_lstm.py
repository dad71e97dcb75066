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
lstm_tagger_int8_dyn_per_channel.
"""
import logging
import os
import shutil
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import numpy_helper
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
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        outs = [o.name for o in sess.get_outputs()]
        for ds in sorted(src.glob("test_data_set_*")):
            inputs = [numpy_helper.to_array(onnx.load_tensor(str(ds / f"input_{k}.pb"))) for k in range(len(names))]
            results = sess.run(None, dict(zip(names, inputs)))
            (dst / ds.name).mkdir()
            for kind, vals, labels in (("input", inputs, names), ("output", results, outs)):
                for k, (v, label) in enumerate(zip(vals, labels)):
                    with open(dst / ds.name / f"{kind}_{k}.pb", "wb") as f:
                        f.write(numpy_helper.from_array(v, label).SerializeToString())
        print(f"{name}: {model} ({', '.join(ops)})")


if __name__ == "__main__":
    main()

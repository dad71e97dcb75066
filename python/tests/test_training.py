"""A model trained by `kiln train` and exported as ONNX runs in onnxruntime with the
accuracy Kiln measured (the CLI binary built by the Rust tests: target/release/kiln,
or $KILN_BIN)."""
import json
import os
import pathlib
import subprocess

import numpy as np
import onnxruntime as ort

from conftest import REPO

TRAINING = pathlib.Path(os.environ.get("KILN_TRAINING", REPO.parent / "shared" / "training"))


def test_exported_model_has_kilns_accuracy_in_onnxruntime(tmp_path):
    kiln = os.environ.get("KILN_BIN", str(REPO / "target" / "release" / "kiln"))
    assert os.path.isfile(kiln), f"the kiln binary is missing at {kiln} (cargo build --release, or set KILN_BIN)"
    out = tmp_path / "trained.onnx"
    digits = str(TRAINING / "digits")
    run = subprocess.run(
        [kiln, "train", str(TRAINING / "lenet_digits_sgd" / "model.onnx"), "--data", digits, "--eval", digits,
         "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4", "--batch", "64",
         "--steps", "200", "-o", str(out), "--json"],
        check=True, capture_output=True, text=True)
    final = json.loads(run.stdout.splitlines()[-1])
    assert final["eval"]["accuracy"] >= 0.97
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.load(TRAINING / "digits" / "test_x.npy")
    y = np.load(TRAINING / "digits" / "test_y.npy")
    logits = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert (logits.argmax(1) == y).mean() == final["eval"]["accuracy"]

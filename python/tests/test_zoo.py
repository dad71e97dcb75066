"""Every zoo model through the Python package against onnxruntime, on the CPU and on the
GPU (lavapipe in CI): against the zoo's reference outputs (onnxruntime's, made on one
machine), and for the float models also against onnxruntime run here on the same inputs.
Relative L2 within 1e-4 on the CPU and 1e-3 on the GPU, as the Rust zoo tests
(tests/zoo.rs) hold, with the same exceptions.

The 8-bit models are not compared with the onnxruntime installed here: its 8-bit
products depend on the machine's instruction set (on an AVX2-only machine its
mobilenet_v2_int8_qop is 0.35 from its own reference made with VNNI, rel. L2)."""
import glob
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import kiln

MODELS = ["mlp", "lenet", "resnet18", "mobilenet_v2", "squeezenet1_1", "ppocr_cls", "ppocr_det", "magika", "bert_tiny", "gpt2_tiny",
          "bert_tiny_int8_dyn", "mobilenet_v2_int8_qop", "resnet18_int8_qdq", "control_flow", "lstm_tagger", "detect_nms"]

# As tests/zoo.rs: 2e-2 for onnxruntime's f32 emulation of QDQ against Kiln's integer
# kernels, and a maximum absolute difference for a detection map whose values saturate.
REL_L2 = {"resnet18_int8_qdq": 2e-2}
QUANTIZED = {"bert_tiny_int8_dyn", "mobilenet_v2_int8_qop", "resnet18_int8_qdq"}
MAX_ABS = {"ppocr_det": 1e-6}


def read_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t.name, numpy_helper.to_array(t)


def feeds(model_dir, session_inputs):
    files = sorted(glob.glob(os.path.join(model_dir, "test_data_set_0", "input_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    out = {}
    for i, f in enumerate(files):
        name, arr = read_pb(f)
        out[name or session_inputs[i]] = arr
    return out


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    n = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (n if n > 0 else 1.0)


@pytest.fixture(scope="module")
def references(zoo):
    """Per model: the feeds, the zoo's reference outputs, and onnxruntime's outputs here
    (None for the 8-bit models)."""
    cache = {}

    def get(name):
        if name not in cache:
            path = str(zoo / name / "model.onnx")
            options = ort.SessionOptions()
            # The zoo's references were made this way.
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            s = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            f = feeds(zoo / name, [i.name for i in s.get_inputs()])
            outs = sorted(glob.glob(str(zoo / name / "test_data_set_0" / "output_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
            stored = [read_pb(p)[1] for p in outs]
            here = None if name in QUANTIZED else s.run(None, f)
            cache[name] = (f, stored, here)
        return cache[name]

    return get


def compare(name, device, got, want, what):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (what, k, g.shape, w.shape)
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w, err_msg=f"{name} output {k} ({what})")
        elif name in MAX_ABS:
            assert np.abs(g.astype(np.float64) - w).max() <= MAX_ABS[name], (name, k, what)
        else:
            limit = REL_L2.get(name, 1e-4 if device == "cpu" else 1e-3)
            e = rel_l2(g, w)
            assert e <= limit, f"{name} on {device}: output {k} rel. L2 {e:.2e} > {limit:.0e} against {what}"


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_matches_onnxruntime(zoo, references, name, device):
    f, stored, here = references(name)
    got = kiln.Session(zoo / name / "model.onnx", device=device).run(None, f)
    compare(name, device, got, stored, "the zoo's onnxruntime reference")
    if here is not None:
        compare(name, device, got, here, "onnxruntime run here")

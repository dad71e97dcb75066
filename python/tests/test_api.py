"""The Python API: sessions from paths and bytes, signatures, numpy in and out without
copies, errors as kiln.KilnError, the GIL released while running, compile(), custom ops."""
import shutil
import threading
import time

import numpy as np
import pytest

import kiln
from conftest import REPO


def test_devices_lists_the_cpu_and_an_adapter():
    d = kiln.devices()
    assert d["cpu"]["threads"] >= 1
    assert d["adapters"], "lavapipe (or a GPU) must be installed: scripts/test.sh installs it"


def test_a_session_describes_its_inputs_and_outputs(zoo):
    s = kiln.Session(zoo / "bert_tiny" / "model.onnx", device="cpu", threads=2)
    names = [i.name for i in s.inputs]
    assert "input_ids" in names and "attention_mask" in names
    ids = s.inputs[names.index("input_ids")]
    assert ids.dtype == "int64"
    assert all(isinstance(d, (int, str)) for d in ids.shape) and any(isinstance(d, str) for d in ids.shape), ids.shape
    assert s.outputs and all(o.dtype == "float32" for o in s.outputs)
    assert "cpu" in s.device
    assert "ValueInfo(name=" in repr(ids)


def test_paths_and_bytes_give_the_same_outputs_and_outputs_are_numpy_without_copies(zoo):
    path = zoo / "mlp" / "model.onnx"
    x = np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)
    a = kiln.Session(str(path), device="cpu").run(None, {"x": x})[0]
    b = kiln.Session(path.read_bytes(), device="cpu").run(["logits"], {"x": x})[0]
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (1, 10)
    np.testing.assert_array_equal(a, b)
    # The array views Kiln's output buffer (no copy) and is the caller's to change.
    base = a.base.obj if isinstance(a.base, memoryview) else a.base
    assert not a.flags["OWNDATA"] and type(base).__name__ == "OutputBuffer", type(base)
    a[0, 0] = 42.0
    assert a[0, 0] == 42.0
    # Lists and strided arrays are accepted (numpy makes them contiguous).
    c = kiln.Session(path, device="cpu").run(None, {"x": np.asfortranarray(x.reshape(28, 28)).reshape(1, 784)})[0]
    np.testing.assert_allclose(c, b, rtol=1e-6)


def test_mistakes_are_kiln_errors_with_kiln_messages(zoo):
    s = kiln.Session(zoo / "mlp" / "model.onnx", device="cpu")
    x = np.zeros((1, 784), np.float32)
    with pytest.raises(kiln.KilnError, match="unknown input 'nope'"):
        s.run(None, {"nope": x})
    with pytest.raises(kiln.KilnError, match="input 'x'"):
        s.run(None, {"x": np.zeros((1, 784), np.int32)})
    with pytest.raises(kiln.KilnError, match="input 'x'"):
        s.run(None, {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(kiln.KilnError, match="no output 'y'"):
        s.run(["y"], {"x": x})
    with pytest.raises(kiln.KilnError):
        kiln.Session(b"not a model", device="cpu")
    with pytest.raises(kiln.KilnError, match="no_such.onnx"):
        kiln.Session("/no_such.onnx", device="cpu")
    with pytest.raises(kiln.KilnError):
        kiln.Session(zoo / "mlp" / "model.onnx", device="no-such-adapter")
    with pytest.raises(TypeError):
        kiln.Session(12, device="cpu")


def test_the_gil_is_released_while_a_model_runs(zoo):
    s = kiln.Session(zoo / "resnet18" / "model.onnx", device="gpu")
    x = np.zeros((1, 3, 224, 224), np.float32)
    s.run(None, {"x": x})  # kernels compiled
    done = threading.Event()
    took = []

    def work():
        t = time.perf_counter()
        s.run(None, {"x": x})
        took.append(time.perf_counter() - t)
        done.set()

    threading.Thread(target=work).start()
    spins = 0
    while not done.is_set():
        spins += 1
    # Python code ran on this thread all along the run (with the GIL held it could
    # only run between the other thread's bytecodes: a handful of times).
    assert spins > 10000, (spins, took)


def test_compile_writes_an_artifact_that_a_session_opens(zoo, tmp_path):
    out = kiln.compile(zoo / "mlp" / "model.onnx", tmp_path / "mlp.kiln", device="cpu")
    x = np.ones((1, 784), np.float32)
    want = kiln.Session(zoo / "mlp" / "model.onnx", device="cpu").run(None, {"x": x})[0]
    got = kiln.Session(out, device="cpu").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(kiln.KilnError, match="no symbolic dim 'batch'"):
        kiln.compile(zoo / "mlp" / "model.onnx", tmp_path / "x.kiln", fix={"batch": 2})


def test_a_custom_op_from_a_manifest_runs_on_the_gpu(tmp_path):
    src = REPO / "samples" / "custom-op-manifest"
    for f in ["swiglu.wgsl", "model.onnx"]:
        shutil.copy(src / f, tmp_path / f)
    manifest = (src / "swiglu.json").read_text()
    # Without the C kernel: the op runs on the GPU only.
    import json

    m = json.loads(manifest)
    del m["cpu"]
    (tmp_path / "swiglu.json").write_text(json.dumps(m))
    s = kiln.Session(tmp_path / "model.onnx", device="gpu", custom_ops=[tmp_path / "swiglu.json"])
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    (y,) = s.run(None, {"x": x})
    assert y.shape == (3, 4)
    import onnx.numpy_helper as nh
    import onnx

    g = onnx.load(str(tmp_path / "model.onnx")).graph
    w = {t.name: nh.to_array(t).astype(np.float64) for t in g.initializer}
    h = x.astype(np.float64) @ w["w1"]
    a, b = h[:, :16], h[:, 16:]
    want = (a / (1 + np.exp(-1.5 * a)) * b) @ w["w2"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="no CPU kernel"):
        kiln.Session(tmp_path / "model.onnx", device="cpu", custom_ops=[tmp_path / "swiglu.json"]).run(None, {"x": x})

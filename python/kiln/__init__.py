"""Kiln: compile and run ONNX models on any GPU (WGSL through wgpu) or on the CPU.

    import kiln, numpy as np
    s = kiln.Session("model.onnx", device="gpu")
    print(s.inputs, s.outputs)
    (y,) = s.run(None, {"x": np.zeros((1, 784), np.float32)})

An API shaped like onnxruntime's: ``Session(path_or_bytes, device=..., threads=...,
custom_ops=[...])``, ``.inputs``/``.outputs`` (name, dtype, shape with symbolic dims as
strings), ``.run(output_names, feeds)`` with numpy arrays in and out. Errors are
``kiln.KilnError`` carrying Kiln's message.
"""
import json as _json
import os as _os

from ._kiln import KilnError, Session, ValueInfo, __version__, _compile, _devices_json

__all__ = ["KilnError", "Session", "ValueInfo", "compile", "devices", "__version__"]


def devices():
    """The CPU and every GPU adapter Kiln finds: ``{"cpu": {...}, "adapters": [...]}``."""
    return _json.loads(_devices_json())


def compile(model, output=None, device="auto", fix=None, custom_ops=None):
    """Compiles an ONNX model into a ``.kiln`` artifact (symbols in ``fix`` fixed, passes
    run for ``device``, custom ops embedded); returns the artifact's path."""
    model = _os.fspath(model)
    if output is None:
        output = _os.path.splitext(model)[0] + ".kiln"
    _compile(model, _os.fspath(output), device, dict(fix or {}), [_os.fspath(p) for p in (custom_ops or [])])
    return _os.fspath(output)

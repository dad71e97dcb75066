"""Writes model.onnx: a SwiGLU feed-forward block, x[N,8] -> MatMul[8,32] -> com.example.SwiGlu
(beta 1.5) -> [N,16] -> MatMul[16,4] -> y[N,4], with fixed pseudo-random weights."""
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

rng = np.random.default_rng(7)
w1 = numpy_helper.from_array((rng.standard_normal((8, 32)) * 0.5).astype(np.float32), "w1")
w2 = numpy_helper.from_array((rng.standard_normal((16, 4)) * 0.5).astype(np.float32), "w2")
nodes = [
    helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
    helper.make_node("SwiGlu", ["h"], ["g"], name="gate", domain="com.example", beta=1.5),
    helper.make_node("MatMul", ["g", "w2"], ["y"], name="down"),
]
graph = helper.make_graph(
    nodes, "swiglu_ffn",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    initializer=[w1, w2],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
model.ir_version = 8
onnx.save(model, __file__.replace("make_model.py", "model.onnx"))

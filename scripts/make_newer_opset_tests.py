#!/usr/bin/env python3
"""Makes tests/data/newer_opsets: small models at opsets 19 to 21 (what current exporters
emit) in the ONNX backend-test layout, with ONNX Runtime's outputs as the reference. Run on
the GPU machine (onnx >= 1.16, onnxruntime and torch there):

    python3 scripts/make_newer_opset_tests.py OUT_DIR    # writes OUT_DIR/newer_opsets.tar.gz

Each case exercises what changed in those opsets for operators Kiln supports: Pad's wrap
mode (19), Resize's half_pixel_symmetric mode (19) with the axes and keep_aspect_ratio_policy
attributes (18), AveragePool's dilations (19), Gelu (20), quantization (per-axis and per-block
Q/DQ, 16-bit zero points, output_dtype; a model from ONNX Runtime's QDQ quantizer), and whole
models restamped or exported at opset 21."""
import io
import os
import sys
import tarfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, version_converter

rng = np.random.default_rng(2026)
cases = {}  # name -> (model, [inputs])


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def single(name, opset, node, inputs, inits=()):
    g = helper.make_graph([node], name, [f32(n, a.shape) for n, a in inputs], [f32("y", None)], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    cases[name] = (m, [a for _, a in inputs])


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


x3 = rand(2, 3, 4)
single("pad_wrap_opset19", 19, helper.make_node("Pad", ["x", "p"], ["y"], mode="wrap"), [("x", x3)],
       [numpy_helper.from_array(np.array([0, 1, 2, 0, 2, 1], np.int64), "p")])
single("pad_wrap_axes_opset19", 19, helper.make_node("Pad", ["x", "p", "", "a"], ["y"], mode="wrap"), [("x", x3)],
       [numpy_helper.from_array(np.array([3, 5], np.int64), "p"), numpy_helper.from_array(np.array([-1], np.int64), "a")])
img = rand(1, 2, 5, 7)
for mode in ("linear", "nearest", "cubic"):
    single(f"resize_{mode}_half_pixel_symmetric_opset19", 19,
           helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode="half_pixel_symmetric"), [("x", img)],
           [numpy_helper.from_array(np.array([1, 1, 1.7, 0.6], np.float32), "s")])
for policy in ("not_larger", "not_smaller", "stretch"):
    single(f"resize_sizes_axes_{policy}_opset19", 19,
           helper.make_node("Resize", ["x", "", "", "z"], ["y"], mode="linear", axes=[2, 3], keep_aspect_ratio_policy=policy), [("x", img)],
           [numpy_helper.from_array(np.array([9, 10], np.int64), "z")])
single("resize_scales_axes_opset18", 18, helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest", axes=[3]), [("x", img)],
       [numpy_helper.from_array(np.array([2.0], np.float32), "s")])
single("averagepool_dilations_opset19", 19,
       helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 0, 1, 2], count_include_pad=0), [("x", rand(1, 3, 8, 9))])
single("averagepool_dilations_include_pad_opset19", 19,
       helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], dilations=[1, 2], pads=[1, 1, 1, 1], count_include_pad=1, strides=[2, 1]),
       [("x", rand(1, 2, 7, 8))])
for approx in ("none", "tanh"):
    single(f"gelu_{approx}_opset20", 20, helper.make_node("Gelu", ["x"], ["y"], approximate=approx), [("x", rand(3, 17))])

# Shape and data movement at opset 21 (the ops whose schemas opset 21 touched).
nodes = [
    helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
    helper.make_node("Shape", ["t"], ["s"]),
    helper.make_node("Reshape", ["t", "r"], ["u"]),
    helper.make_node("Unsqueeze", ["u", "a0"], ["v"]),
    helper.make_node("Squeeze", ["v", "a0"], ["w"]),
    helper.make_node("Flatten", ["w"], ["f"], axis=1),
    helper.make_node("Cast", ["f"], ["c"], to=TensorProto.DOUBLE),
    helper.make_node("Cast", ["c"], ["d"], to=TensorProto.FLOAT),
    helper.make_node("Pad", ["d", "pp"], ["e"], mode="constant"),
    helper.make_node("Identity", ["e"], ["y"]),
]
g = helper.make_graph(nodes, "shape_ops_opset21", [f32("x", [2, 3, 4])], [f32("y", None)],
                      initializer=[numpy_helper.from_array(np.array([2, -1], np.int64), "r"), numpy_helper.from_array(np.array([0], np.int64), "a0"),
                                   numpy_helper.from_array(np.array([1, 0, 0, 2], np.int64), "pp")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
m.ir_version = 10
cases["shape_ops_opset21"] = (m, [rand(2, 3, 4)])

# Quantization at opsets 19 to 21: per-axis and per-block (21) scales, int16 and uint16 zero
# points (21), and the output_dtype attribute (21) in place of a zero point.
def graph_case(name, opset, nodes, x, inits, outputs):
    g = helper.make_graph(nodes, name, [f32("x", list(x.shape))], [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                          initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    cases[name] = (m, [x])


xq = rand(2, 3, 8) * 4
graph_case("qdq_per_axis_int8_opset19", 19,
           [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)],
           xq, {"s": np.array([0.02, 0.05, 0.11], np.float32), "z": np.array([-3, 0, 7], np.int8)}, [("q", TensorProto.INT8), ("y", TensorProto.FLOAT)])
graph_case("qdq_blocked_int8_opset21", 21,
           [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=2, block_size=3),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=2, block_size=3)],
           xq, {"s": (rng.random((2, 3, 3)) * 0.1 + 0.01).astype(np.float32), "z": rng.integers(-5, 5, (2, 3, 3)).astype(np.int8)},
           [("q", TensorProto.INT8), ("y", TensorProto.FLOAT)])
for zt, nt, name in ((np.int16, TensorProto.INT16, "int16"), (np.uint16, TensorProto.UINT16, "uint16")):
    graph_case(f"qdq_{name}_opset21", 21,
               [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
               xq, {"s": np.array(0.0007, np.float32), "z": np.array(300, zt)}, [("q", nt), ("y", TensorProto.FLOAT)])
graph_case("quantize_output_dtype_opset21", 21, [helper.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.INT8)],
           xq, {"s": np.array(0.03, np.float32)}, [("y", TensorProto.INT8)])

# Kiln's bundled models restamped at opset 21 by ONNX's version converter.
here = os.path.dirname(os.path.abspath(__file__))
for name in ("small_cnn", "transformer_block", "mlp"):
    src = onnx.load(os.path.join(here, "..", "models", name, "model.onnx"))
    conv = version_converter.convert_version(src, 21)
    inputs = []
    for vi in conv.graph.input:
        if any(init.name == vi.name for init in conv.graph.initializer):
            continue
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
        inputs.append(rand(*shape))
    cases[f"{name}_opset21"] = (conv, inputs)

# A real exporter's output at a newer opset: torch's dynamo exporter, when it can.
try:
    import torch
    import torchvision

    torch.manual_seed(0)

    class Small(torch.nn.Module):  # conv, BatchNorm, depthwise, Hardswish, pooling, attention, LayerNorm, GELU
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                                            torch.nn.Conv2d(16, 16, 3, 1, 1, groups=16), torch.nn.Hardswish(),
                                            torch.nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.MaxPool2d(2))
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
            self.norm = torch.nn.LayerNorm(16)
            self.head = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 10))

        def forward(self, x):
            t = self.stem(x).flatten(2).transpose(1, 2)
            t = self.norm(t + self.attn(t, t, t, need_weights=False)[0])
            return self.head(t.mean(1))

    net = Small()
    with torch.no_grad():  # calibrated BatchNorm statistics, not the defaults
        net.train()
        for _ in range(3):
            net(torch.randn(4, 3, 32, 32))
    net.eval()
    x = torch.randn(1, 3, 32, 32)
    prog = torch.onnx.export(net, (x,), dynamo=True, opset_version=20)
    prog.save("/tmp/small_torch.onnx")
    exported = onnx.load("/tmp/small_torch.onnx")
    cases["small_torch_dynamo_opset20"] = (exported, [x.numpy()])
except Exception as e:  # the exporter is not what this test set is about; note and go on
    print("torch export skipped:", repr(e)[:300])

# A QDQ model from ONNX Runtime's static quantizer (per-channel int8 weights, uint8
# activations, MinMax calibration on random inputs), restamped at opset 21.
try:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self, name, shape):
            self.items = iter([{name: rand(*shape)} for _ in range(8)])

        def get_next(self):
            return next(self.items, None)

    src = os.path.join(here, "..", "models", "small_cnn", "model.onnx")
    m = onnx.load(src)
    vi = m.graph.input[0]
    shape = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
    quantize_static(src, "/tmp/small_cnn_qdq.onnx", Reader(vi.name, shape), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    q = onnx.load("/tmp/small_cnn_qdq.onnx")
    q = version_converter.convert_version(q, 21) if max(i.version for i in q.opset_import if i.domain in ("", "ai.onnx")) < 21 else q
    cases["small_cnn_qdq_ort_opset21"] = (q, [rand(*shape)])
except Exception as e:
    print("ORT quantizer skipped:", repr(e)[:300])

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
tar = tarfile.open(os.path.join(out_dir, "newer_opsets.tar.gz"), "w:gz")


def add(path, data):
    info = tarfile.TarInfo(path)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


for name, (model, inputs) in sorted(cases.items()):
    opt = ort.SessionOptions()
    opt.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opt, providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    outs = sess.run(None, feeds)
    add(f"{name}/model.onnx", model.SerializeToString())
    for k, (i, a) in enumerate(zip(sess.get_inputs(), inputs)):
        add(f"{name}/test_data_set_0/input_{k}.pb", numpy_helper.from_array(a, i.name).SerializeToString())
    for k, (o, a) in enumerate(zip(sess.get_outputs(), outs)):
        add(f"{name}/test_data_set_0/output_{k}.pb", numpy_helper.from_array(np.asarray(a), o.name).SerializeToString())
    print(f"{name:50s} opset {max(i.version for i in model.opset_import if i.domain in ('', 'ai.onnx'))}  nodes {len(model.graph.node)}  outputs {[np.asarray(a).shape for a in outs]}")
tar.close()
print("cases:", len(cases))

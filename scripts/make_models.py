#!/usr/bin/python3
"""Builds the bundled example models under models/ with seeded random weights.

Uses Debian's python3-onnx and python3-numpy. Each model gets a test_data_set_0 with
random inputs and outputs computed here by numpy in float64 (an independent reference
for Kiln's runtime). Run from the repository root: /usr/bin/python3 scripts/make_models.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
rng = np.random.default_rng(20261202)


def weight(name, shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def save(name, graph, inputs, outputs):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln-make-models")
    onnx.checker.check_model(model)
    folder = os.path.join("models", name)
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    onnx.save(model, os.path.join(folder, "model.onnx"))
    for i, (n, a) in enumerate(inputs):
        onnx.save_tensor(numpy_helper.from_array(a, n), os.path.join(folder, "test_data_set_0", f"input_{i}.pb"))
    for i, (n, a) in enumerate(outputs):
        onnx.save_tensor(numpy_helper.from_array(a.astype(np.float32), n), os.path.join(folder, "test_data_set_0", f"output_{i}.pb"))


def arr(init):
    return numpy_helper.to_array(init).astype(np.float64)


def erf(x):
    # Abramowitz-Stegun 7.1.26 is too coarse; use math.erf elementwise in float64.
    import math
    return np.vectorize(math.erf)(x)


def mlp():
    w1, b1 = weight("w1", [64, 128]), weight("b1", [128], 0.1)
    w2, b2 = weight("w2", [128, 10]), weight("b2", [10], 0.1)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
        helper.make_node("Add", ["h3", "b2"], ["logits"]),
    ]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], [w1, b1, w2, b2])
    x = rng.standard_normal((4, 64)).astype(np.float32)
    h = np.maximum(x.astype(np.float64) @ arr(w1) + arr(b1), 0)
    save("mlp", g, [("x", x)], [("logits", h @ arr(w2) + arr(b2))])


def conv2d(x, w, b, pad):
    n, c, hh, ww = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = hh + 2 * pad - kh + 1, ww + 2 * pad - kw + 1
    out = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return out + b.reshape(1, -1, 1, 1)


def cnn():
    c1w, c1b = weight("c1w", [16, 3, 3, 3]), weight("c1b", [16], 0.1)
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in [
        ("bn_s", rng.uniform(0.5, 1.5, 16)), ("bn_b", rng.standard_normal(16) * 0.1),
        ("bn_m", rng.standard_normal(16) * 0.1), ("bn_v", rng.uniform(0.5, 1.5, 16))]]
    c2w, c2b = weight("c2w", [32, 16, 3, 3]), weight("c2b", [32], 0.1)
    fw, fb = weight("fw", [10, 32]), weight("fb", [10], 0.1)
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"], transB=1),
    ]
    g = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], [c1w, c1b] + bn + [c2w, c2b, fw, fb])
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    s, b, m, v = (arr(t).reshape(1, -1, 1, 1) for t in bn)
    y = conv2d(x.astype(np.float64), arr(c1w), arr(c1b), 1)
    y = np.maximum((y - m) / np.sqrt(v + 1e-5) * s + b, 0)
    y = y.reshape(2, 16, 16, 2, 16, 2).max(axis=(3, 5))
    y = np.maximum(conv2d(y, arr(c2w), arr(c2b), 1), 0).mean(axis=(2, 3))
    save("small_cnn", g, [("x", x)], [("logits", y @ arr(fw).T + arr(fb))])


def transformer():
    d, heads, seq, ff = 64, 4, 16, 128
    dh = d // heads
    inits = {n: weight(n, s) for n, s in [("wq", [d, d]), ("wk", [d, d]), ("wv", [d, d]), ("wo", [d, d]), ("w1", [d, ff]), ("w2", [ff, d])]}
    inits.update({n: weight(n, [s], 0.1) for n, s in [("bq", d), ("bk", d), ("bv", d), ("bo", d), ("b1", ff), ("b2", d)]})
    inits["g1"] = numpy_helper.from_array((1 + 0.1 * rng.standard_normal(d)).astype(np.float32), "g1")
    inits["be1"] = weight("be1", [d], 0.1)
    consts = {
        # -1 for the batch: the block runs at any batch size (as exports with a dynamic batch do).
        "shape_heads": np.array([-1, seq, heads, dh], np.int64), "shape_back": np.array([-1, seq, d], np.int64),
        "scale": np.array(1.0 / np.sqrt(dh), np.float32), "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
        "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32), "sqrt2": np.array(np.sqrt(2.0), np.float32),
    }
    for n, v in consts.items():
        inits[n] = numpy_helper.from_array(v, n)
    N = helper.make_node
    nodes = []
    for p in "qkv":
        nodes += [N("MatMul", ["x", f"w{p}"], [f"{p}0"]), N("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
                  N("Reshape", [f"{p}1", "shape_heads"], [f"{p}2"]),
                  N("Transpose", [f"{p}2"], [f"{p}h"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    nodes += [
        N("MatMul", ["qh", "kh"], ["s0"]), N("Mul", ["s0", "scale"], ["s1"]), N("Softmax", ["s1"], ["attn"], axis=-1),
        N("MatMul", ["attn", "vh"], ["o0"]), N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        N("Reshape", ["o1", "shape_back"], ["o2"]), N("MatMul", ["o2", "wo"], ["o3"]), N("Add", ["o3", "bo"], ["o4"]),
        N("Add", ["x", "o4"], ["res1"]),
        # LayerNorm written out as primitive ops (the pattern a fusion pass recognizes).
        N("ReduceMean", ["res1"], ["mu"], axes=[-1]), N("Sub", ["res1", "mu"], ["xc"]), N("Pow", ["xc", "two"], ["sq"]),
        N("ReduceMean", ["sq"], ["var"], axes=[-1]), N("Add", ["var", "eps"], ["ve"]), N("Sqrt", ["ve"], ["sd"]),
        N("Div", ["xc", "sd"], ["nrm"]), N("Mul", ["nrm", "g1"], ["ln0"]), N("Add", ["ln0", "be1"], ["ln"]),
        # Feed-forward with GELU written as x * 0.5 * (1 + erf(x / sqrt 2)).
        N("MatMul", ["ln", "w1"], ["f0"]), N("Add", ["f0", "b1"], ["f1"]), N("Div", ["f1", "sqrt2"], ["g0"]),
        N("Erf", ["g0"], ["g1e"]), N("Add", ["g1e", "one"], ["g2"]), N("Mul", ["f1", "g2"], ["g3"]), N("Mul", ["g3", "half"], ["gelu"]),
        N("MatMul", ["gelu", "w2"], ["f2"]), N("Add", ["f2", "b2"], ["f3"]), N("Add", ["ln", "f3"], ["y"]),
    ]
    g = helper.make_graph(nodes, "transformer_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", seq, d])], list(inits.values()))
    x = rng.standard_normal((1, seq, d)).astype(np.float32)
    W = {k: arr(v) for k, v in inits.items()}
    xd = x.astype(np.float64)
    def heads_of(t):
        return t.reshape(1, seq, heads, dh).transpose(0, 2, 1, 3)
    q, k, v = (heads_of(xd @ W[f"w{p}"] + W[f"b{p}"]) for p in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = (a @ v).transpose(0, 2, 1, 3).reshape(1, seq, d) @ W["wo"] + W["bo"]
    r = xd + o
    mu = r.mean(-1, keepdims=True)
    ln = (r - mu) / np.sqrt(((r - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * W["g1"] + W["be1"]
    f = ln @ W["w1"] + W["b1"]
    gl = f * 0.5 * (1 + erf(f / np.sqrt(2.0)))
    save("transformer_block", g, [("x", x)], [("y", ln + gl @ W["w2"] + W["b2"])])


if __name__ == "__main__":
    mlp()
    cnn()
    transformer()

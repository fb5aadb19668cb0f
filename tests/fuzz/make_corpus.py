#!/usr/bin/env python3
"""Writes the fuzz regression corpus (tests/fuzz/corpus/<kind>/): one small input for every
class of crash, hang or silent wrong answer that Kiln has been shown to have, made from the
description of each fault. kiln_fuzz --replay runs them all on every CI run; inputs the
fuzzer itself finds are saved with --save and copied in beside these.

Run with Debian's python3 (python3-onnx): /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
HUGE = (1 << 62) + 1


def write(kind, name, data):
    os.makedirs(os.path.join(ROOT, kind), exist_ok=True)
    with open(os.path.join(ROOT, kind, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def model(name, nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    write("onnx", name + ".onnx", m.SerializeToString())


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def raw_init(name, dtype, dims, raw):
    t = TensorProto()
    t.name, t.data_type = name, dtype
    t.dims.extend(dims)
    t.raw_data = raw
    return t


# 1. Shape arithmetic: dims whose product wraps past 2^64.
wrap = raw_init("w", TensorProto.FLOAT, [HUGE, 4], b"\0" * 16)
model("huge_initializer_add", [helper.make_node("Add", ["x", "w"], ["y"])], [f32("x", [1, 4])], [f32("y", None)], [wrap])
model("huge_initializer_gather", [helper.make_node("Gather", ["w", "i"], ["y"])], [helper.make_tensor_value_info("i", TensorProto.INT64, [2])], [f32("y", None)], [wrap])
model("huge_input_relu", [helper.make_node("Relu", ["x"], ["y"])], [f32("x", [HUGE, 4])], [f32("y", None)])
bn = [raw_init(n, TensorProto.FLOAT, [HUGE], b"\0" * 4) for n in ("s", "b", "m", "v")]
model("huge_batchnorm_fold",
      [helper.make_node("Conv", ["x", "cw"], ["c"]), helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
      [f32("x", [1, 1, 4, 4])], [f32("y", None)], [numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "cw")] + bn)

# 2. Attributes out of the spec's range.
for op in ("MaxPool", "AveragePool", "LpPool"):
    for attr in ("strides", "dilations"):
        if op != "MaxPool" and attr == "dilations":
            continue
        model(f"{op.lower()}_empty_{attr}", [helper.make_node(op, ["x"], ["y"], kernel_shape=[2, 2], **{attr: []})], [f32("x", [1, 1, 4, 4])], [f32("y", None)])
model("conv_pads_2e62", [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1 << 62] * 4)], [f32("x", [1, 1, 4, 4])], [f32("y", None)],
      [numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")])
model("layernorm_rank0", [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"])], [f32("x", [])], [f32("y", None)],
      [numpy_helper.from_array(np.ones((1,), np.float32), "g"), numpy_helper.from_array(np.zeros((1,), np.float32), "b")])
model("onehot_depth_2e62", [helper.make_node("OneHot", ["i", "d", "v"], ["y"])], [helper.make_tensor_value_info("i", TensorProto.INT64, [3])], [f32("y", None)],
      [numpy_helper.from_array(np.array([1 << 62], np.int64), "d"), numpy_helper.from_array(np.array([0, 1], np.float32), "v")])
model("resize_scales_1e9", [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest")], [f32("x", [1, 1, 2, 2])], [f32("y", None)],
      [numpy_helper.from_array(np.array([1, 1, 1e9, 1e9], np.float32), "s")], opset=13)
model("split_rank0", [helper.make_node("Split", ["x"], ["y"])], [f32("x", [])], [f32("y", None)], opset=11)

# 3. Integer division of INT64_MIN by -1 (at run time, and folded as constants at build time).
i64 = lambda n, s: helper.make_tensor_value_info(n, TensorProto.INT64, s)
for op in ("Div", "Mod"):
    model(f"{op.lower()}_int64_min_by_minus_one", [helper.make_node(op, ["a", "b"], ["y"])], [i64("a", [1])], [i64("y", None)],
          [numpy_helper.from_array(np.array([-1], np.int64), "b")])
    model(f"{op.lower()}_int64_min_folded", [helper.make_node(op, ["a", "b"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])], [i64("x", [1])], [i64("y", None)],
          [numpy_helper.from_array(np.array([np.iinfo(np.int64).min], np.int64), "a"), numpy_helper.from_array(np.array([-1], np.int64), "b")])

# 6. External data that would block: a FIFO (kiln_fuzz makes "fifo" in its work folder) and a device.
for target in ("fifo", "dev_zero"):
    t = TensorProto()
    t.name, t.data_type = "w", TensorProto.FLOAT
    t.dims.append(4)
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=target)
    model(f"external_data_{target}", [helper.make_node("Add", ["x", "w"], ["y"])], [f32("x", [4])], [f32("y", None)], [t])

# Runtime input files with dims that wrap.
x = np.zeros((1, 64), np.float32)
header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, 64), }" % HUGE
header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
write("tensor", "npy_dims_wrap.tensor", b"npy\n\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + x.tobytes())
pb = numpy_helper.from_array(x, "x")
pb.dims[0] = HUGE
write("tensor", "pb_dims_wrap.tensor", b"pb\n" + pb.SerializeToString())

# 7. Requests that crashed or misled the server.
write("request", "stream_wrong_type.request", "completion\n" + json.dumps({"prompt": [1, 2], "stream": "yes"}))
write("request", "max_tokens_int64_max.request", "completion\n" + json.dumps({"prompt": [1], "max_tokens": (1 << 63) - 1}))
write("request", "token_id_past_uint64.request", "completion\n" + json.dumps({"prompt": [1, (1 << 64) - 1]}))
write("request", "split_character_prompt.request", "chat\n" + json.dumps({"messages": [{"role": "user", "content": "\U0001F600\u4e2d"}]}))

# 8. Config values that gave NaN with exit 0, and JSON type errors.
gpt2 = {"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 300, "n_inner": 24}
for name, change in (("epsilon_negative", {"layer_norm_epsilon": -1}), ("model_type_number", {"model_type": 5}), ("n_embd_string", {"n_embd": "16"}),
                     ("vocab_2e63", {"vocab_size": (1 << 63) - 1})):
    write("llm", f"config_{name}.llm", "config.json\n" + json.dumps({**gpt2, **change}))
write("llm", "tokenizer_merge_types.llm", "tokenizer.json\n" + json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [[1, 2]]}}))
print("corpus written to", ROOT, file=sys.stderr)

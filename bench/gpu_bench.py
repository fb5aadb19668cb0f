#!/usr/bin/env python3
"""Kiln on the GPU against PyTorch, in one run on one machine (the device machine).

Exports real-architecture models with seeded random weights (torchvision ResNet-50 and
MobileNetV2; transformers BERT-base at sequence 128, ViT-B/16, GPT-2 small prefill at 128
tokens) to ONNX at each batch size, then times, with CUDA events on device-resident inputs:
PyTorch eager fp16, torch.compile (default, reduce-overhead, and max-autotune where asked:
its compile is slow, so by default only at batch 32), and Kiln's
default CUDA route (fp16). Kiln's time is the GPU compute of `kiln bench` (device events,
copies excluded, as for PyTorch). Outputs are checked against PyTorch fp32: Kiln's relative
L2 error is printed next to eager fp16's own error. Prints a table of medians and ratios
(against eager and against the best torch.compile mode of the row) and writes JSON (with GPU,
driver and commit) to --out.

Usage: bench/gpu_bench.py --kiln build-gpu/src/tools/kiln --out results.json
       [--models resnet50,bert_base] [--batches 1,8,32,64]
       [--compile default,reduce-overhead,max-autotune] [--max-autotune-batches 32]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

WORK = "/tmp/kiln_gpu_bench"


def calibrate_batchnorm(m):
    """Sets BatchNorm statistics from random images, as training would. With torchvision's
    initial statistics (mean 0, var 1) MobileNetV2's activations shrink layer by layer until
    its fp16 output is all zeros, which would make every fp16 comparison meaningless."""
    for mod in m.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None  # cumulative average over the calibration batches
    m.train()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(16, 3, 224, 224, generator=g))
    m.eval()


def make_model(name):
    """Returns (module, input specs [(name, kind, shape-without-batch)], output name)."""
    torch.manual_seed(0)
    if name in ("resnet50", "mobilenet_v2"):
        import torchvision
        m = getattr(torchvision.models, name)(weights=None)
        calibrate_batchnorm(m)
        return m, [("input", "image", (3, 224, 224))], "output"
    import transformers as tf
    if name == "bert_base":
        cfg = tf.BertConfig()
        cfg._attn_implementation = "eager"
        inner = tf.BertModel(cfg, add_pooling_layer=False)

        class Bert(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, input_ids, attention_mask):
                return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        return Bert(), [("input_ids", "tokens", (128,)), ("attention_mask", "mask", (128,))], "last_hidden_state"
    if name == "vit_b16":
        cfg = tf.ViTConfig()
        cfg._attn_implementation = "eager"
        inner = tf.ViTModel(cfg, add_pooling_layer=False)

        class Vit(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, pixel_values):
                return self.m(pixel_values=pixel_values).last_hidden_state

        return Vit(), [("pixel_values", "image", (3, 224, 224))], "last_hidden_state"
    if name == "gpt2":
        cfg = tf.GPT2Config()
        cfg._attn_implementation = "eager"
        inner = tf.GPT2LMHeadModel(cfg)

        class Gpt2(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, input_ids):
                return self.m(input_ids=input_ids, use_cache=False).logits

        return Gpt2(), [("input_ids", "tokens", (128,))], "logits"
    raise SystemExit(f"unknown model {name}")


def make_inputs(specs, batch, vocab=1000):
    g = torch.Generator().manual_seed(1)
    out = {}
    for name, kind, shape in specs:
        if kind == "image":
            out[name] = torch.randn((batch,) + shape, generator=g)
        elif kind == "tokens":
            out[name] = torch.randint(0, vocab, (batch,) + shape, generator=g)
        else:
            out[name] = torch.ones((batch,) + shape, dtype=torch.int64)
    return out


def export(model, inputs, out_name, path):
    args = tuple(inputs.values())
    try:
        torch.onnx.export(model, args, path, input_names=list(inputs), output_names=[out_name], opset_version=17, dynamo=False)
    except Exception as e:  # the TorchScript exporter refuses some models: use dynamo
        print(f"  TorchScript export failed ({type(e).__name__}); using the dynamo exporter", flush=True)
        torch.onnx.export(model, args, path, input_names=list(inputs), output_names=[out_name], opset_version=18, dynamo=True)


def time_cuda(fn, iters=50, warmup=10):
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
    return statistics.median(times)


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(cmd, timeout=900):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}... failed: {(p.stderr or p.stdout).strip()[-400:]}")
    return p.stdout


def bench_one(args, name, batch, compile_modes):
    row = {"model": name, "batch": batch}
    model, specs, out_name = make_model(name)
    model.eval()
    inputs = make_inputs(specs, batch)
    d = os.path.join(WORK, f"{name}_b{batch}")
    os.makedirs(d, exist_ok=True)
    onnx_path = os.path.join(d, "model.onnx")
    t0 = time.time()
    export(model, inputs, out_name, onnx_path)
    row["export_s"] = round(time.time() - t0, 1)
    for k, v in inputs.items():
        np.save(os.path.join(d, k + ".npy"), v.numpy())
    dev = {k: v.cuda() for k, v in inputs.items()}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.cuda()
    with torch.inference_mode():
        ref = model(*dev.values()).float().cpu().numpy()
        m16 = model.half()
        dev16 = {k: (v.half() if v.is_floating_point() else v) for k, v in dev.items()}
        eager_out = m16(*dev16.values()).float().cpu().numpy()
    row["eager_fp16_rel_l2"] = rel_l2(eager_out, ref)
    row["eager_fp16_ms"] = time_cuda(lambda: m16(*dev16.values()))
    for mode in compile_modes:
        key = "compile_" + mode.replace("-", "_") + "_ms"
        try:
            torch._dynamo.reset()
            t0 = time.time()
            cm = torch.compile(m16, mode=None if mode == "default" else mode)
            with torch.inference_mode():
                cm(*dev16.values())
            row[key.replace("_ms", "_compile_s")] = round(time.time() - t0, 1)
            row[key] = time_cuda(lambda: cm(*dev16.values()))
        except Exception as e:
            row[key] = None
            row[key.replace("_ms", "_error")] = f"{type(e).__name__}: {str(e)[:200]}"
    del m16, model
    torch.cuda.empty_cache()
    # Kiln: build once (tactics timed at these shapes), check outputs, then bench the engine.
    engine = os.path.join(d, "model.engine")
    input_flags = []
    for k in inputs:
        input_flags += ["--input", f"{k}={os.path.join(d, k + '.npy')}"]
    t0 = time.time()
    run([args.kiln, "build", onnx_path, "--target", "cuda", "-o", engine])
    row["kiln_build_s"] = round(time.time() - t0, 1)
    outdir = os.path.join(d, "kiln_out")
    run([args.kiln, "run", engine, *input_flags, "--outputs-dir", outdir, "--npy"])
    got = np.load(os.path.join(outdir, "output_0.npy"))
    row["kiln_rel_l2"] = rel_l2(got, ref)
    row["kiln_vs_eager16_rel_l2"] = rel_l2(got, eager_out)
    bench = json.loads(run([args.kiln, "bench", engine, *input_flags, "--json", "--iterations", "100", "--duration", "2"]))
    g = bench.get("gpu", {})
    row["kiln_ms"] = g.get("compute_ms", {}).get("median")
    row["kiln_end_to_end_ms"] = bench["latency_ms"]["median"]
    row["kiln_cuda_graph"] = g.get("cuda_graph_replayed")
    row["kiln_cpu_nodes"] = len(g.get("cpu_nodes", []))
    if g.get("cpu_nodes"):
        row["kiln_cpu_node_example"] = g["cpu_nodes"][0][:160]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert_base,vit_b16,gpt2")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--compile", default="default,reduce-overhead,max-autotune", help="torch.compile modes to time ('' for none)")
    ap.add_argument("--max-autotune-batches", default="32", help="batches at which max-autotune is timed (its compile is slow)")
    ap.add_argument("--max-autotune-models", default="", help="models for which max-autotune is timed (default: all)")
    args = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    modes = [m for m in args.compile.split(",") if m]
    ma_batches = {int(b) for b in args.max_autotune_batches.split(",") if b}
    ma_models = set(args.max_autotune_models.split(",")) if args.max_autotune_models else None
    rows = []
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(0),
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
        "torch": torch.__version__,
        "commit": os.environ.get("KILN_COMMIT", "unknown"),
        "timing": "median of CUDA-event times on device-resident inputs; Kiln: GPU compute of kiln bench (copies excluded)",
    }
    for name in args.models.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            use = [m for m in modes if m != "max-autotune" or (batch in ma_batches and (ma_models is None or name in ma_models))]
            print(f"== {name} batch {batch}", flush=True)
            try:
                row = bench_one(args, name, batch, use)
            except Exception as e:
                row = {"model": name, "batch": batch, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print("  " + json.dumps(row), flush=True)
            rows.append(row)
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)

    def fmt(v):
        return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    print(f"\nGPU {meta['gpu']}, driver {meta['driver']}, torch {meta['torch']}, commit {meta['commit']}")
    modes_ms = [("compile_default_ms", "default"), ("compile_reduce_overhead_ms", "r-o"), ("compile_max_autotune_ms", "max-at")]
    print(f"{'model':<13}{'b':>3} {'eager16':>9} {'compile':>9} {'r-o':>9} {'max-at':>9} {'kiln16':>9} {'k/eager':>8} {'k/best':>7} {'best':>7} {'kiln err':>9} {'eager err':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<13}{r['batch']:>3} error: {r['error'][:90]}")
            continue
        k = r.get("kiln_ms")
        timed = [(r[key], label) for key, label in modes_ms if r.get(key)]
        best, best_label = min(timed) if timed else (None, "-")
        r["best_compile_ms"], r["kiln_over_best_compile"] = best, (k / best if k and best else None)
        print(f"{r['model']:<13}{r['batch']:>3} {fmt(r.get('eager_fp16_ms')):>9} {fmt(r.get('compile_default_ms')):>9} {fmt(r.get('compile_reduce_overhead_ms')):>9} "
              f"{fmt(r.get('compile_max_autotune_ms')):>9} {fmt(k):>9} {fmt(k / r['eager_fp16_ms'] if k and r.get('eager_fp16_ms') else None):>8} "
              f"{fmt(r['kiln_over_best_compile']):>7} {best_label:>7} {r.get('kiln_rel_l2', 0):9.2e} {r.get('eager_fp16_rel_l2', 0):9.2e}")
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

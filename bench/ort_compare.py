#!/usr/bin/python3
"""Kiln (default route) vs ONNX Runtime 1.30 (npm onnxruntime-node, CPU) in one run.

For each bundled model and each model in ../shared/models: batch 1 from test_data_set_0 and
a larger batch (inputs tiled along dim 0, where the model's batch dim is symbolic or can be
made so), same thread count for both, outputs compared (relative L2), medians and the
Kiln/ORT ratio printed; results saved to bench/results/ with date, machine and commit.
Kiln and ORT take turns (--rounds, default 3) and the figures are medians over the rounds, so
that a shared machine's drift does not land on one side only; each round's ratio is printed.

Usage: bench/ort_compare.py [--threads N] [--duration S] [--rounds R] [--batch 8] [--kiln PATH] [--models a,b]
Installs onnxruntime-node into bench/node_modules (npm --ignore-scripts) when missing.
"""
import argparse, datetime, glob, json, os, platform, shutil, subprocess, tempfile

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


def ensure_ort():
    if not os.path.isdir(os.path.join(BENCH, "node_modules", "onnxruntime-node")):
        subprocess.run(["npm", "install", "--no-save", "--ignore-scripts", "--prefix", BENCH, "onnxruntime-node@1.30"], check=True, capture_output=True)


def models():
    for base in (os.path.join(ROOT, "models"), os.path.join(ROOT, "..", "shared", "models")):
        for d in sorted(glob.glob(os.path.join(base, "*"))):
            if os.path.exists(os.path.join(d, "model.onnx")):
                yield os.path.basename(d), d


def batched_model(src, dst, batch):
    """Copy of the model with dim 0 of every input and output symbolic; None if it cannot be."""
    m = onnx.load(src, load_external_data=True)
    for v in list(m.graph.input) + list(m.graph.output):
        dims = v.type.tensor_type.shape.dim
        if not dims:
            return None
        dims[0].ClearField("dim_value")
        dims[0].dim_param = "batch"
    onnx.save(m, dst)
    return dst


def run(model, inputs, batch, threads, duration, kiln, work, rounds):
    npys = []
    for i, a in enumerate(inputs):
        a = np.concatenate([a] * batch, axis=0) if batch > 1 else a
        p = os.path.join(work, f"input_{i}.npy")
        np.save(p, a)
        npys.append(p)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    args = [kiln, "bench", model, "--duration", str(duration), "--json"] + sum((["--input", f"{n}={p}"] for n, p in zip(input_names(model), npys)), [])
    # Kiln and ORT take turns for `rounds` rounds of duration / rounds each, so that drift of
    # a shared machine (other tenants) hits both alike; the figures are medians over rounds.
    args[args.index("--duration") + 1] = str(max(0.5, duration / rounds))
    k = subprocess.run(args, capture_output=True, text=True, env=env)
    ort = lambda: subprocess.run(["node", os.path.join(BENCH, "ort_runner.js"), model, str(threads), str(max(0.5, duration / rounds)), work] + npys,
                                 capture_output=True, text=True, env=dict(os.environ, NODE_PATH=os.path.join(BENCH, "node_modules")))
    if k.returncode:
        # Exports that fix the batch inside (a Reshape or Concat to batch 1) fail in both runtimes.
        if batch > 1 and ort().returncode:
            return {"error": f"the export fixes batch 1 inside: Kiln and ONNX Runtime both refuse batch {batch} ({k.stderr.strip()[:80]})", "static_batch": True}
        return {"error": "kiln: " + k.stderr.strip()}
    kiln_ms, ort_ms = [json.loads(k.stdout)["latency_ms"]["median"]], []
    out_dir = os.path.join(work, "kiln_out")
    subprocess.run([kiln, "run", model, "--outputs-dir", out_dir, "--npy"] + sum((["--input", f"{n}={p}"] for n, p in zip(input_names(model), npys)), []),
                   check=True, capture_output=True, env=env)
    for r in range(rounds):
        if r > 0:
            kiln_ms.append(json.loads(subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout)["latency_ms"]["median"])
        o = ort()
        if o.returncode:
            return {"error": "ort: " + o.stderr.strip()[-200:]}
        ort_ms.append(json.loads(o.stdout)["median_ms"])
    a = np.load(os.path.join(out_dir, "output_0.npy")).astype(np.float64)
    b = np.load(os.path.join(work, "ort_output_0.npy")).astype(np.float64)
    rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    # The ratio is the median of the rounds' ratios: each pairs runs close in time.
    ratios = [a / b for a, b in zip(kiln_ms, ort_ms)]
    return {"kiln_median_ms": float(np.median(kiln_ms)), "ort_median_ms": float(np.median(ort_ms)), "ratio": float(np.median(ratios)), "rel_l2": rel,
            "kiln_rounds_ms": kiln_ms, "ort_rounds_ms": ort_ms, "round_ratios": ratios}


def input_names(model):
    m = onnx.load(model, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return [v.name for v in m.graph.input if v.name not in inits]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "src", "tools", "kiln"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of timing per runtime, model and batch, split over the rounds")
    ap.add_argument("--rounds", type=int, default=3, help="Kiln and ORT alternate this many times")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--models", default="", help="comma-separated model names (default: all)")
    a = ap.parse_args()
    ensure_ort()
    rows = []
    for name, d in models():
        if a.models and name not in a.models.split(","):
            continue
        inputs = [numpy_helper.to_array(onnx.load_tensor(p)) for p in sorted(glob.glob(os.path.join(d, "test_data_set_0", "input_*.pb")))]
        for batch in (1, a.batch):
            with tempfile.TemporaryDirectory() as work:
                model = os.path.join(d, "model.onnx")
                if batch > 1:
                    shutil.copytree(d, os.path.join(work, "m"), ignore=shutil.ignore_patterns("test_data_set_*"))
                    model = batched_model(os.path.join(d, "model.onnx"), os.path.join(work, "m", "model.onnx"), batch)
                r = run(model, inputs, batch, a.threads, a.duration, a.kiln, work, max(1, a.rounds)) if model else {"error": "no batch dim"}
            # The test data's own batch (2 for small_cnn), tiled `batch` times.
            actual = batch * (inputs[0].shape[0] if inputs and inputs[0].ndim else 1)
            r.update({"model": name, "batch": actual})
            rows.append(r)
            if "error" in r:
                print(f"{name:18s} b{actual:<3d} skipped: {r['error'][:110]}")
            else:
                spread = " ".join(f"{x:.2f}" for x in r["round_ratios"])
                print(f"{name:18s} b{actual:<3d} kiln {r['kiln_median_ms']:9.3f} ms  ort {r['ort_median_ms']:9.3f} ms  kiln/ort {r['ratio']:6.2f}  "
                      f"(rounds {spread})  rel-l2 {r['rel_l2']:.1e}")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    date = datetime.date.today().isoformat()
    out = os.path.join(BENCH, "results", f"{date}-cpu-vs-ort-{commit}.json")
    with open(out, "w") as f:
        json.dump({"meta": {"date": date, "machine": platform.node(), "cpu": platform.processor(), "cores": os.cpu_count(), "threads": a.threads,
                            "rounds": a.rounds, "duration_s": a.duration, "commit": commit, "ort": "onnxruntime-node 1.30 (CPU EP, all graph optimizations)"}, "results": rows}, f, indent=2)
    print("saved", out)


if __name__ == "__main__":
    main()

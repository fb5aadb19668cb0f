#!/usr/bin/env python3
"""Int8 on the CPU over zoo models. For each model (obtained first where missing):
- makes its QDQ form with ONNX Runtime's static quantizer (per-channel int8 weights, uint8
  activations, MinMax over --calib sample inputs), as bench/zoo/models/<name>/model_qdq.onnx;
- times, taking turns for --rounds rounds at --threads: Kiln f32 (model.onnx), Kiln int8 and
  ONNX Runtime int8 (both on model_qdq.onnx);
- checks Kiln int8 against ORT int8 (max-abs in steps of each output's last quantizer) and
  against ORT f32 (rel-L2; top-1 agreement over --agree inputs for classifiers).
With --quantizer kiln: Kiln's own `kiln calibrate` + `kiln build --int8` against Kiln f32
instead (no ONNX Runtime needed).
Writes bench/results/<date>-zoo-int8-cpu-<machine>[-tag].json.

Usage: bench/zoo/int8.py --kiln build/src/tools/kiln [--models resnet50,bert_base] [--threads 4]
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

ZOO = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ZOO)
import obtain  # noqa: E402
from run_zoo import ROOT, OrtCpu, rel_l2, run, save_inputs, shape_flags  # noqa: E402


def quantize(spec, src, dst, calib):
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([obtain.sample_inputs(spec, 1, seed=100 + k) for k in range(calib)])

        def get_next(self):
            return next(self.items, None)

    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return onnx.load(dst)


def output_steps(model):
    """Each graph output's quantization step: the scale of the DequantizeLinear producing it (or None)."""
    from onnx import numpy_helper
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    steps = []
    for o in model.graph.output:
        n = producer.get(o.name)
        s = inits.get(n.input[1]) if n is not None and n.op_type == "DequantizeLinear" else None
        steps.append(float(np.max(s)) if s is not None else None)
    return steps


def kiln_outputs(kiln, engine, flags, work, env):
    out = os.path.join(work, "k")
    subprocess.run(["rm", "-rf", out])
    run([kiln, "run", engine, "--outputs-dir", out, "--npy"] + flags, env=env)
    got = []
    while os.path.exists(os.path.join(out, f"output_{len(got)}.npy")):
        got.append(np.load(os.path.join(out, f"output_{len(got)}.npy")))
    return got


def ort_session(ort, model, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def model_row(a, spec, ort_cpu, kiln):
    import onnxruntime as ort
    d = os.path.join(obtain.MODELS, spec["name"])
    f32, qdq = os.path.join(d, "model.onnx"), os.path.join(d, "model_qdq.onnx")
    row = {"model": spec["name"], "family": spec["family"], "batch": 1}
    try:
        qmodel = quantize(spec, f32, qdq, a.calib) if not os.path.exists(qdq) else __import__("onnx").load(qdq)
    except Exception as e:
        return dict(row, error=f"quantizer: {type(e).__name__}: {str(e)[:200]}")
    steps = output_steps(qmodel)
    row["qdq_nodes"] = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in qmodel.graph.node)
    inputs = obtain.sample_inputs(spec, 1)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as work:
        npys, flags = save_inputs(inputs, work)
        engines = {}
        try:
            for key, model in (("f32", f32), ("int8", qdq)):
                engines[key] = os.path.join(work, key + ".engine")
                run([kiln, "build", model, "--threads", str(a.threads), "-o", engines[key]] + shape_flags(inputs), env=env)
            got = kiln_outputs(kiln, engines["int8"], flags, work, env)
        except RuntimeError as e:
            return dict(row, error="kiln: " + str(e))
        ms = {"kiln_f32": [], "kiln_int8": [], "ort_int8": []}
        per_round = max(0.5, a.duration / a.rounds)
        for _ in range(a.rounds):  # the runtimes take turns, so drift lands on all
            for key in ("f32", "int8"):
                b = json.loads(run([kiln, "bench", engines[key], "--threads", str(a.threads), "--duration", str(per_round), "--json"] + flags, env=env))
                ms["kiln_" + key].append(b["latency_ms"]["median"])
                if key == "int8":
                    row["int8_coverage"] = b.get("coverage", {})
            t, ref_q = ort_cpu.time(qdq, inputs, npys, per_round, work)
            ms["ort_int8"].append(t)
        for k, v in ms.items():
            row[k + "_ms"] = float(np.median(v))
        row["int8_speedup_vs_kiln_f32"] = row["kiln_f32_ms"] / row["kiln_int8_ms"]
        row["ratio_vs_ort_int8"] = float(np.median([k / o for k, o in zip(ms["kiln_int8"], ms["ort_int8"])]))
        # Accuracy: against ORT's int8 (in output steps) and against f32 (ORT's f32 session).
        worst_steps = 0.0
        for g, r, s in zip(got, ref_q, steps):
            if s:
                worst_steps = max(worst_steps, float(np.max(np.abs(g.astype(np.float64) - r))) / s)
        row["vs_ort_int8_max_steps"] = worst_steps
        s32 = ort_session(ort, f32, a.threads)
        row["vs_f32_rel_l2"] = max(rel_l2(g, r) for g, r in zip(got, s32.run(None, inputs)))
        if spec["family"] == "cnn" and a.agree > 0:
            same = 0
            for k in range(a.agree):
                x = obtain.sample_inputs(spec, 1, seed=1000 + k)
                _, xflags = save_inputs(x, work)
                same += int(np.argmax(kiln_outputs(kiln, engines["int8"], xflags, work, env)[0]) == np.argmax(s32.run(None, x)[0]))
            row["top1_agreement_vs_f32"] = same / a.agree
    return row


def kiln_quantized_row(a, spec, kiln):
    """Kiln's own post-training quantization: `kiln calibrate` on --calib sample inputs, then
    `kiln build --int8`; against Kiln f32 (speed, rel-L2, argmax agreement over the last axis)."""
    f32 = os.path.join(obtain.MODELS, spec["name"], "model.onnx")
    row = {"model": spec["name"], "family": spec["family"], "batch": 1, "quantizer": "kiln calibrate " + a.method}
    inputs = obtain.sample_inputs(spec, 1)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as work:
        for k in range(a.calib):
            d = os.path.join(work, "calib", f"s{k}")
            os.makedirs(d)
            for i, v in enumerate(obtain.sample_inputs(spec, 1, seed=100 + k).values()):
                np.save(os.path.join(d, f"input_{i}.npy"), v)
        npys, flags = save_inputs(inputs, work)
        engines = {k: os.path.join(work, k + ".engine") for k in ("f32", "int8")}
        calib = os.path.join(work, "calib.json")
        try:
            run([kiln, "calibrate", f32, "--data", os.path.join(work, "calib"), "--method", a.method, "-o", calib], env=env)
            run([kiln, "build", f32, "--threads", str(a.threads), "-o", engines["f32"]] + shape_flags(inputs), env=env)
            run([kiln, "build", f32, "--int8", "--calib", calib, "--threads", str(a.threads), "-o", engines["int8"]] + shape_flags(inputs), env=env)
            ref = kiln_outputs(kiln, engines["f32"], flags, work, env)
            got = kiln_outputs(kiln, engines["int8"], flags, work, env)
        except RuntimeError as e:
            return dict(row, error="kiln: " + str(e))
        ms = {"kiln_f32": [], "kiln_int8": []}
        per_round = max(0.5, a.duration / a.rounds)
        for _ in range(a.rounds):
            for key in ("f32", "int8"):
                b = json.loads(run([kiln, "bench", engines[key], "--threads", str(a.threads), "--duration", str(per_round), "--json"] + flags, env=env))
                ms["kiln_" + key].append(b["latency_ms"]["median"])
        for k, v in ms.items():
            row[k + "_ms"] = float(np.median(v))
        row["int8_speedup_vs_kiln_f32"] = float(np.median([f / q for f, q in zip(ms["kiln_f32"], ms["kiln_int8"])]))
        row["vs_f32_rel_l2"] = max(rel_l2(g, r) for g, r in zip(got, ref))
        row["argmax_agreement_vs_f32"] = float(np.mean(np.argmax(got[0], -1) == np.argmax(ref[0], -1)))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "src", "tools", "kiln"))
    ap.add_argument("--models", default="resnet50,mobilenet_v3_large,bert_base", help="comma-separated zoo names (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=4, help="threads of each runtime (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="turns each runtime takes (default: %(default)s)")
    ap.add_argument("--duration", type=float, default=3, help="seconds of timing per runtime and model (default: %(default)s)")
    ap.add_argument("--calib", type=int, default=16, help="calibration inputs for the quantizer (default: %(default)s)")
    ap.add_argument("--agree", type=int, default=32, help="inputs for top-1 agreement of classifiers (default: %(default)s)")
    ap.add_argument("--quantizer", choices=["ort", "kiln"], default="ort",
                    help="ort: QDQ models from ORT's quantizer, against ORT int8; kiln: kiln calibrate + build --int8, against Kiln f32 (default: %(default)s)")
    ap.add_argument("--method", default="minmax", help="with --quantizer kiln: the calibration method (default: %(default)s)")
    ap.add_argument("--tag", default="", help="added to the results file's name")
    a = ap.parse_args()
    specs = {s["name"]: s for s in obtain.manifest()}
    unknown = [m for m in a.models.split(",") if m not in specs]
    if unknown:
        sys.exit(f"int8.py: unknown model(s) {','.join(unknown)} (see bench/zoo/manifest.json)")
    ort_cpu = OrtCpu(a.threads) if a.quantizer == "ort" else None
    meta = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()} ({os.cpu_count()} cores)", "threads": a.threads,
            "ort": ort_cpu.kind if ort_cpu else None, "quantizer": a.quantizer, "commit": os.environ.get("KILN_COMMIT", ""), "what": "Kiln int8 (QDQ from ORT's quantizer) against ORT int8 and Kiln f32" if ort_cpu else "Kiln int8 (kiln calibrate) against Kiln f32"}
    out = os.path.join(ROOT, "bench", "results", f"{meta['date']}-zoo-int8-cpu-vm{'-' + a.tag if a.tag else ''}.json")
    rows = []
    for name in a.models.split(","):
        obtain.obtain(specs[name])
        rows.append(model_row(a, specs[name], ort_cpu, a.kiln) if ort_cpu else kiln_quantized_row(a, specs[name], a.kiln))
        r = rows[-1]
        if "error" not in r and not ort_cpu:
            print(f"{name:22s} kiln f32 {r['kiln_f32_ms']:.2f} ms  kiln int8 {r['kiln_int8_ms']:.2f}  speedup {r['int8_speedup_vs_kiln_f32']:.2f}x  "
                  f"vs f32 rel-L2 {r['vs_f32_rel_l2']:.3f}  argmax agreement {r['argmax_agreement_vs_f32']:.3f}", flush=True)
        else:
            print(f"{name:22s} " + (r["error"] if "error" in r else
              f"kiln f32 {r['kiln_f32_ms']:.2f} ms  kiln int8 {r['kiln_int8_ms']:.2f}  ort int8 {r['ort_int8_ms']:.2f}  "
              f"int8/f32 speedup {r['int8_speedup_vs_kiln_f32']:.2f}x  kiln/ort int8 {r['ratio_vs_ort_int8']:.2f}  "
              f"vs ort int8 {r['vs_ort_int8_max_steps']:.1f} steps  vs f32 rel-L2 {r['vs_f32_rel_l2']:.3f}  "
              f"top-1 {r.get('top1_agreement_vs_f32', '-')}"), flush=True)
        with open(out, "w") as f:  # after every model: a run cut short keeps what it measured
            json.dump({"meta": meta, "results": rows}, f, indent=1)
    print("saved", os.path.relpath(out, ROOT))


if __name__ == "__main__":
    main()

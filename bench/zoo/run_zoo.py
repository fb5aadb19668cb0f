#!/usr/bin/env python3
"""Runs the zoo: obtains what is missing, then for each model at each of its batches
- CPU: Kiln (default route) against ONNX Runtime (Python onnxruntime where installed, else
  npm onnxruntime-node), both at --threads, taking turns for --rounds rounds; outputs checked
  (f32: rel-L2 <= 1e-4, or max-abs <= 1e-6 where the reference is near zero); the nodes left on
  reference kernels counted from `kiln bench --json`'s coverage;
- GPU (--gpu, where CUDA is): Kiln CUDA fp16 against torch eager fp16 and torch.compile
  (default, reduce-overhead), checked against PyTorch fp32 (within 2x eager fp16's own error);
  host-fallback nodes counted.
Writes bench/results/<date>-zoo-<part>-<machine>.json and regenerates docs/zoo.md.

Usage: bench/zoo/run [--cpu] [--gpu] [--models a,b] [--threads 4] [--rounds 3] [--duration 3] [--jobs N --cores 4-15]
"""
import argparse
import copy
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ZOO = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(ZOO))
sys.path.insert(0, ZOO)
import obtain  # noqa: E402
import report  # noqa: E402


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check_outputs(got, ref, rel_tol, abs_tol):
    """Worst output's error; ok when every output meets rel-L2 or (near zero) max-abs."""
    worst = {"rel_l2": 0.0, "max_abs": 0.0, "ok": True}
    if len(got) != len(ref):
        return {"ok": False, "why": f"{len(got)} outputs, reference has {len(ref)}"}
    for i, (a, b) in enumerate(zip(got, ref)):
        if a.shape != b.shape:
            return {"ok": False, "why": f"output {i} shape {list(a.shape)}, reference {list(b.shape)}"}
        if a.size == 0:
            continue
        if a.dtype.kind in "iub" or b.dtype.kind in "iub":
            mism = int(np.count_nonzero(a.astype(np.int64) != b.astype(np.int64)))
            if mism:
                worst.update(ok=False, why=f"output {i}: {mism} of {a.size} integer values differ")
            continue
        r, m = rel_l2(a, b), float(np.max(np.abs(a.astype(np.float64) - b)))
        worst["rel_l2"], worst["max_abs"] = max(worst["rel_l2"], r), max(worst["max_abs"], m)
        if not (r <= rel_tol or m <= abs_tol):
            worst.update(ok=False, why=f"output {i}: rel-L2 {r:.2e}, max-abs {m:.2e}")
    return worst


TIMEOUT = 600  # seconds for one command; --timeout sets it


def run(cmd, env=None, timeout=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout or TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{os.path.basename(cmd[0])} {cmd[1]} timed out after {timeout or TIMEOUT} s")
    if p.returncode:
        raise RuntimeError((p.stderr or p.stdout).strip().splitlines()[-1][:300] if (p.stderr or p.stdout).strip() else f"exit {p.returncode}")
    return p.stdout


class OrtCpu:
    """ONNX Runtime on the CPU: the Python package where installed, else npm onnxruntime-node."""

    def __init__(self, threads):
        self.threads = threads
        try:
            import onnxruntime
            self.ort, self.kind = onnxruntime, "onnxruntime " + onnxruntime.__version__ + " (Python)"
        except ImportError:
            self.ort = None
            bench = os.path.join(ROOT, "bench")
            if not os.path.isdir(os.path.join(bench, "node_modules", "onnxruntime-node")):
                run(["npm", "install", "--no-save", "--ignore-scripts", "--prefix", bench, "onnxruntime-node@1.30"])
            self.kind = "onnxruntime-node 1.30 (npm)"

    def time(self, model, inputs, npys, duration, work):
        """Median ms and the outputs (as arrays)."""
        if self.ort:
            so = self.ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = self.threads, 1
            so.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            s = self.ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            outs = None
            for _ in range(3):
                outs = s.run(None, inputs)
            times, t_end = [], time.perf_counter() + duration
            while len(times) < 5 or time.perf_counter() < t_end:
                t0 = time.perf_counter()
                s.run(None, inputs)
                times.append((time.perf_counter() - t0) * 1000)
            return float(np.median(times)), outs
        out = run(["node", os.path.join(ROOT, "bench", "ort_runner.js"), model, str(self.threads), str(duration), work] + npys,
                  env=dict(os.environ, NODE_PATH=os.path.join(ROOT, "bench", "node_modules")))
        n = 0
        outs = []
        while os.path.exists(os.path.join(work, f"ort_output_{n}.npy")):
            outs.append(np.load(os.path.join(work, f"ort_output_{n}.npy")))
            n += 1
        return json.loads(out)["median_ms"], outs


def kiln_flags(names, npys):
    return sum((["--input", f"{n}={p}"] for n, p in zip(names, npys)), [])


def save_inputs(inputs, work):
    """The inputs as .npy files in `work`: their paths and the `--input` flags naming them."""
    npys = []
    for n, v in inputs.items():
        npys.append(os.path.join(work, n + ".npy"))
        np.save(npys[-1], v)
    return npys, kiln_flags(list(inputs), npys)


def shape_flags(inputs):
    """`kiln build`'s profile: each input's shape as min, opt and max (scalars need none)."""
    flags = []
    for n, v in inputs.items():
        if v.ndim:
            dims = "x".join(str(d) for d in v.shape)
            flags += sum(([f"--{k}Shapes", f"{n}:{dims}"] for k in ("min", "opt", "max")), [])
    return flags


def cpu_row(a, spec, batch, ort, kiln):
    model = os.path.join(obtain.MODELS, spec["name"], "model.onnx")
    inputs = obtain.sample_inputs(spec, batch)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as work:
        npys, flags = save_inputs(inputs, work)
        row = {}
        # The engine is built once (its tactics timed at these shapes), then run and timed.
        # The outputs first: a model Kiln cannot run is a finding, reported with its error.
        engine = os.path.join(work, "model.engine")
        try:
            t0 = time.perf_counter()
            run([kiln, "build", model, "--threads", str(a.threads), "-o", engine] + shape_flags(inputs), env=env)
            row["build_s"] = round(time.perf_counter() - t0, 2)
            run([kiln, "run", engine, "--threads", str(a.threads), "--outputs-dir", os.path.join(work, "k"), "--npy"] + flags, env=env)
        except RuntimeError as e:
            return {"error": "kiln: " + str(e)}
        got = []
        while os.path.exists(os.path.join(work, "k", f"output_{len(got)}.npy")):
            got.append(np.load(os.path.join(work, "k", f"output_{len(got)}.npy")))
        kiln_ms, ort_ms, ref = [], [], None
        per_round = max(0.5, a.duration / a.rounds)
        for r in range(a.rounds):  # the runtimes take turns, so drift lands on both
            b = json.loads(run([kiln, "bench", engine, "--threads", str(a.threads), "--duration", str(per_round), "--json"] + flags, env=env))
            kiln_ms.append(b["latency_ms"]["median"])
            row["coverage"] = b.get("coverage", {})
            try:
                ms, ref = ort.time(model, inputs, npys, per_round, work)
            except Exception as e:
                row["ort_error"] = str(e)[:300]
                break
            ort_ms.append(ms)
        row["kiln_ms"] = float(np.median(kiln_ms))
        if ort_ms:
            row["ort_ms"] = float(np.median(ort_ms))
            row["ratio"] = float(np.median([k / o for k, o in zip(kiln_ms, ort_ms)]))
            row["accuracy"] = check_outputs(got, [np.asarray(x) for x in ref], 1e-4, 1e-6)
        return row


def gpu_row(a, spec, batch, kiln):
    import torch
    model = os.path.join(obtain.MODELS, spec["name"], "model.onnx")
    inputs = obtain.sample_inputs(spec, batch)
    row = {}
    with tempfile.TemporaryDirectory() as work:
        npys, flags = save_inputs(inputs, work)
        engine = os.path.join(work, "model.engine")
        try:
            run([kiln, "build", model, "--target", "cuda", "--fp16", "-o", engine] + shape_flags(inputs))
            run([kiln, "run", engine, "--outputs-dir", os.path.join(work, "k"), "--npy"] + flags)
            b = json.loads(run([kiln, "bench", engine, "--json", "--duration", str(a.duration)] + flags))
        except RuntimeError as e:
            return {"error": "kiln: " + str(e)}
        g = b.get("gpu", {})
        row.update(kiln_ms=g.get("compute_ms", {}).get("median"), host_fallback_nodes=len(g.get("cpu_nodes", [])), host_fallback=g.get("cpu_nodes", [])[:20])
        got = []
        while os.path.exists(os.path.join(work, "k", f"output_{len(got)}.npy")):
            got.append(np.load(os.path.join(work, "k", f"output_{len(got)}.npy")))
    if spec["source"] == "npm":
        return row  # no PyTorch module to compare with
    torch.manual_seed(0)
    builders = {"torchvision": obtain.torchvision_model, "timm": obtain.timm_model, "transformers": obtain.transformers_model, "torch": obtain.torch_model}
    module = builders[spec["source"]](spec)[0].cuda().eval()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = [torch.from_numpy(v).cuda() for v in inputs.values()]
    as_list = lambda o: [x.float().cpu().numpy() for x in (o if isinstance(o, (tuple, list)) else (o,))]
    # The f16 copy is made before any run: modules that cache tensors on their first eval run
    # (timm LeViT's attention biases) would keep f32 caches through .half().
    m16 = copy.deepcopy(module).half()
    with torch.inference_mode():
        ref = as_list(module(*dev))
        dev16 = [x.half() if x.is_floating_point() else x for x in dev]
        eager = as_list(m16(*dev16))
    eager_err = max(rel_l2(e, r) for e, r in zip(eager, ref))
    kiln_err = max(rel_l2(k, r) for k, r in zip(got, ref)) if len(got) == len(ref) else float("inf")
    row["accuracy"] = {"rel_l2": kiln_err, "eager_fp16_rel_l2": eager_err, "ok": kiln_err <= max(2 * eager_err, 1e-3)}

    def time_cuda(fn, iters=50):
        with torch.inference_mode():
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            ts = []
            for _ in range(iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e))
        return float(np.median(ts))

    row["eager_fp16_ms"] = time_cuda(lambda: m16(*dev16))
    for mode in filter(None, a.compile_modes.split(",")):
        try:
            torch._dynamo.reset()
            cm = torch.compile(m16, mode=None if mode == "default" else mode)
            row[f"compile_{mode}_ms"] = time_cuda(lambda: cm(*dev16))
        except Exception as e:
            row[f"compile_{mode}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
    best = min([row[k] for k in ("compile_default_ms", "compile_reduce-overhead_ms") if row.get(k)] or [float("nan")])
    row["ratio_vs_compile"] = row["kiln_ms"] / best if row.get("kiln_ms") and best == best else None
    row["ratio_vs_eager"] = row["kiln_ms"] / row["eager_fp16_ms"] if row.get("kiln_ms") else None
    del m16, module
    torch.cuda.empty_cache()
    return row


def parse_cores(text):
    """'4-15' or '0,2,4-7' as a list of core numbers."""
    cores = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cores += list(range(int(lo), int(hi or lo) + 1))
    return cores


_worker = {}


def _start_worker(a, core_sets):
    """A CPU-part worker: pinned to its own cores, so that workers running side by side (and
    Kiln and ORT inside each) do not share cores."""
    cores = core_sets.get()
    if cores:
        os.sched_setaffinity(0, cores)
    _worker["ort"] = OrtCpu(a.threads)


def one_row(job):
    a, s, m, batch, part = job
    try:
        r = cpu_row(a, s, batch, _worker["ort"], a.kiln) if part == "cpu" else gpu_row(a, s, batch, a.kiln)
    except Exception as e:  # one model's failure is a row, not the end of the run
        r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"model": s["name"], "family": s["family"], "batch": batch, "opset": m["opset"], "nodes": m["nodes"], **r}


def main():
    global TIMEOUT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "src", "tools", "kiln"))
    ap.add_argument("--cpu", action="store_true", help="the CPU part (default when neither is named)")
    ap.add_argument("--gpu", action="store_true", help="the CUDA part")
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--batches", default="", help="only these batches (default: each model's own)")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="Kiln and ORT alternate this many times")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of timing per runtime, model and batch")
    ap.add_argument("--jobs", type=int, default=1, help="CPU part: models measured side by side, each on its own --threads cores (default: 1)")
    ap.add_argument("--cores", default="", help="CPU part: the cores the jobs share out, as 4-15 (default: all this process may use)")
    ap.add_argument("--compile-modes", default="default,reduce-overhead", help="GPU part: torch.compile modes to compare with ('' for eager only)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one Kiln or ORT command may take (default: 600)")
    ap.add_argument("--tag", default="", help="added to the results file's name, so that runs in parts keep apart (report.py merges a day's files)")
    ap.add_argument("--no-obtain", action="store_true", help="run only the models already obtained")
    a = ap.parse_args()
    TIMEOUT = a.timeout
    if not (a.cpu or a.gpu):
        a.cpu = True
    wanted = list(filter(None, a.models.split(",")))
    by_name = {s["name"]: s for s in obtain.manifest()}
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        sys.exit(f"run_zoo.py: unknown models: {', '.join(unknown)}")
    specs = [by_name[w] for w in wanted] if wanted else list(by_name.values())  # in the order given
    only_batches = {int(b) for b in a.batches.split(",") if b}
    ort_kind = OrtCpu(a.threads).kind if a.cpu else None
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for part in [p for p, on in (("cpu", a.cpu), ("gpu", a.gpu)) if on]:
        meta = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                "commit": os.environ.get("KILN_COMMIT", commit), "part": part}
        if part == "cpu":
            meta.update(threads=a.threads, rounds=a.rounds, jobs=a.jobs, ort=ort_kind)
        else:
            import torch
            meta.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, compile_modes=a.compile_modes)
        rows, jobs = [], []
        out = os.path.join(ROOT, "bench", "results", f"{meta['date']}-zoo-{part}-{meta['machine']}{'-' + a.tag if a.tag else ''}.json")
        for s in specs:
            try:
                m = obtain.obtain(s) if not a.no_obtain else json.load(open(os.path.join(obtain.MODELS, s["name"], "meta.json")))
            except (obtain.Missing, FileNotFoundError) as e:
                rows.append({"model": s["name"], "family": s["family"], "skipped": str(e)[:200]})
                print(f"{s['name']:28s} skipped: {str(e)[:90]}", flush=True)
                continue
            except Exception as e:
                rows.append({"model": s["name"], "family": s["family"], "error": f"obtain: {type(e).__name__}: {str(e)[:200]}"})
                continue
            jobs += [(a, s, m, b, part) for b in s.get("batches", [1]) if not only_batches or b in only_batches]

        def save(r):
            rows.append(r)
            print(report.summary_line(r), flush=True)
            with open(out, "w") as f:
                json.dump({"meta": meta, "results": rows}, f, indent=1)

        if part == "cpu" and a.jobs > 1:
            import multiprocessing
            ctx = multiprocessing.get_context("spawn")
            cores = parse_cores(a.cores) or sorted(os.sched_getaffinity(0))
            core_sets = ctx.Queue()
            for i in range(a.jobs):
                core_sets.put(cores[i * a.threads:(i + 1) * a.threads] or None)
            with ctx.Pool(a.jobs, initializer=_start_worker, initargs=(a, core_sets)) as pool:
                for r in pool.imap_unordered(one_row, jobs):
                    save(r)
        else:
            if part == "cpu":
                if a.cores:
                    os.sched_setaffinity(0, parse_cores(a.cores))
                _worker["ort"] = OrtCpu(a.threads)
            for job in jobs:
                save(one_row(job))
        print("saved", os.path.relpath(out, ROOT))
    report.main()

if __name__ == "__main__":
    main()

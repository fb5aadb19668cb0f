#!/usr/bin/python3
"""Times Kiln's default route on the bundled models and ../shared/models with `kiln bench --json`.

Usage: bench/bench_models.py [--kiln build/src/tools/kiln] [--duration 2] [--out bench/results/FILE.json]
Prints a table of median latencies; with --out also writes the raw JSON with date and machine.
"""
import argparse, datetime, json, os, platform, subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def models():
    for base in (os.path.join(ROOT, "models"), os.path.join(ROOT, "..", "shared", "models")):
        if os.path.isdir(base):
            for name in sorted(os.listdir(base)):
                d = os.path.join(base, name)
                if os.path.exists(os.path.join(d, "model.onnx")):
                    yield name, d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "src", "tools", "kiln"))
    ap.add_argument("--duration", default="2")
    ap.add_argument("--route", default="")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    for name, d in models():
        cmd = [a.kiln, "bench", os.path.join(d, "model.onnx"), "--inputs-dir", os.path.join(d, "test_data_set_0"), "--duration", a.duration, "--json"]
        if a.route:
            cmd += ["--route", a.route]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        rows.append({"model": name, **r})
        print(f"{name:20s} median {r['latency_ms']['median']:10.3f} ms  p90 {r['latency_ms']['p90']:10.3f} ms  runs {r['runs']}")
    if a.out:
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(), "cpu": platform.processor(),
                "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()

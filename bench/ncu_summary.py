#!/usr/bin/env python3
"""Sums kernel durations from `ncu --csv --metrics gpu__time_duration.sum` output by kernel
name and prints the top entries (a profiling aid for the CUDA backend)."""
import collections
import csv
import sys

scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
total = collections.Counter()
count = collections.Counter()
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = row["Kernel Name"][:90]
    total[name] += float(row["Metric Value"].replace(",", "")) * scale.get(row["Metric Unit"], 1.0)
    count[name] += 1
all_ms = sum(total.values())
print(f"{'kernel':<92}{'calls':>6}{'ms':>10}{'%':>7}")
for name, ms in total.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 25):
    print(f"{name:<92}{count[name]:>6}{ms:>10.3f}{100 * ms / all_ms:>7.1f}")
print(f"total {all_ms:.3f} ms in {sum(count.values())} kernels")

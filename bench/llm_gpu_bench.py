#!/usr/bin/env python3
"""LLM runtime on the GPU machine against Hugging Face transformers (issue: LLM runtime).

Makes random-weight fp16 models with transformers (GPT-2 small; a 1.1B Llama with
TinyLlama's shape), saves them as Hugging Face folders, then in one run:
  * checks Kiln's greedy tokens (kiln generate --target cuda) against transformers' greedy
    generate on the same prompt;
  * measures HBM bandwidth (device-to-device copy) and Kiln's batch-1 decode time per
    token, next to the bandwidth limit (weight bytes / bandwidth);
  * measures output tokens/s at concurrency 64 (kiln bench-llm, in-process) next to
    transformers generate with batch 64, same prompt and output lengths.
Prints a summary table last and writes JSON to $OUT (or /tmp).
Usage (device): source scripts/gpu-env; python3 bench/llm_gpu_bench.py --kiln $KILN_BIN
"""
import argparse
import json
import os
import subprocess
import time

import torch

WORK = "/tmp/kiln_llm_bench"


def hbm_bandwidth_gbs():
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        y.copy_(x)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    del x, y
    torch.cuda.empty_cache()
    return 2 * (2 << 30) / (times[len(times) // 2] / 1000) / 1e9  # read + write


def make_model(name):
    import transformers as tf
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = tf.GPT2Config()
        cls = tf.GPT2LMHeadModel
    else:  # TinyLlama-1.1B's shape
        cfg = tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                             vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False)
        cls = tf.LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        m = cls(cfg).half().eval()
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    m.save_pretrained(d, safe_serialization=True)
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        raise RuntimeError(f"{d}: save_pretrained wrote no single model.safetensors: {os.listdir(d)}")
    params = sum(p.numel() for p in m.parameters())
    # Weights a decode step reads in full: all but the token-embedding table (one row a token)
    # unless it is also the LM head (tied, GPT-2), and GPT-2's position table (one row).
    skipped = 0 if cfg.tie_word_embeddings else m.get_input_embeddings().weight.numel()
    if name == "gpt2":
        skipped += m.transformer.wpe.weight.numel()
    return m, d, params, params - skipped


def kiln(args, *cmd, timeout=600, env=None, stderr_to=None):
    p = subprocess.run([args.kiln, *cmd], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    if p.returncode != 0:
        raise RuntimeError(f"kiln {' '.join(cmd[:2])} failed: {(p.stderr or p.stdout).strip()[-600:]}")
    if stderr_to is not None:
        stderr_to.append(p.stderr)
    return p.stdout


def hf_generate_tps(m, batch, prompt_len, new_tokens, vocab):
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, vocab, (batch, prompt_len), device="cuda", generator=g)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        m.generate(ids, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        torch.cuda.synchronize()
        t0 = time.time()
        m.generate(ids, **kw)
        torch.cuda.synchronize()
    return batch * new_tokens / (time.time() - t0)


def bench_model(args, name, bw):
    row = {"model": name}
    m, d, params, streamed = make_model(name)
    vocab = m.config.vocab_size
    row["params"] = params
    weight_bytes = 2 * streamed  # f16, each weight read once per decode step
    row["weight_gb"] = weight_bytes / 1e9
    # Greedy agreement with transformers.
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, vocab, (32,), generator=g).tolist()
    n_new = 16
    with torch.inference_mode():
        hf = m.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0)[0, 32:].tolist()
    out = json.loads(kiln(args, "generate", d, "--target", "cuda", "--tokens", ",".join(map(str, prompt)), "--max-tokens", str(n_new), "--json"))
    ours = out["output_tokens"]
    agree = 0
    for a, b in zip(ours, hf):
        if a != b:
            break
        agree += 1
    row["greedy_tokens_identical_prefix"] = f"{agree}/{n_new}"
    row["greedy_kiln"], row["greedy_hf"] = ours, hf
    # Batch 1 decode.
    b1_args = ["bench-llm", d, "--target", "cuda", "--requests", "3", "--concurrency", "1", "--input-len", "128", "--output-len", "128",
               "--max-batch-size", "1", "--max-num-tokens", "256", "--num-blocks", "64", "--json"]
    b1 = json.loads(kiln(args, *b1_args))
    if args.profile:  # where a batch-1 decode step's GPU time goes (src/llm/cuda/step_profiler.h)
        reports = []
        for mode in ("steps", "stages"):
            kiln(args, *b1_args, env={"KILN_LLM_PROFILE": mode}, stderr_to=reports)
        row["b1_profile"] = reports
        print("\n".join(reports), flush=True)
    row["kiln_b1_tpot_ms"] = b1["tpot_ms"]["median"]
    if args.pdl_ab:  # the same run without programmatic dependent launch
        row["kiln_b1_tpot_ms_no_pdl"] = json.loads(kiln(args, *b1_args, "--route", "llm.cuda.pdl=off"))["tpot_ms"]["median"]
    row["bandwidth_limit_ms"] = weight_bytes / (bw * 1e9) * 1000
    row["b1_vs_bandwidth_limit"] = row["kiln_b1_tpot_ms"] / row["bandwidth_limit_ms"]
    row["hf_b1_tokens_per_s"] = hf_generate_tps(m, 1, 128, 128, vocab)
    # Concurrency 64.
    if args.skip_c64:
        return row
    c64 = json.loads(kiln(args, "bench-llm", d, "--target", "cuda", "--requests", "64", "--concurrency", "64", "--input-len", "128", "--output-len", "128",
                          "--max-batch-size", "64", "--max-num-tokens", "2048", "--num-blocks", "1200", "--json"))
    row["kiln_c64_tokens_per_s"] = c64["output_tokens_per_s"]
    row["kiln_c64_ttft_ms"] = c64["ttft_ms"]["median"]
    row["kiln_c64_tpot_ms"] = c64["tpot_ms"]["median"]
    row["kiln_kv_utilization"] = c64["kv_cache"]["max_utilization"]
    row["hf_c64_tokens_per_s"] = hf_generate_tps(m, 64, 128, 128, vocab)
    row["c64_speedup_vs_hf"] = row["kiln_c64_tokens_per_s"] / row["hf_c64_tokens_per_s"]
    del m
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--models", default="gpt2,llama1b")
    ap.add_argument("--profile", action="store_true", help="also print the GPU decoder's batch-1 step profile")
    ap.add_argument("--skip-c64", action="store_true", help="only greedy agreement and batch-1 decode")
    ap.add_argument("--pdl-ab", action="store_true", help="also time batch-1 decode with --route llm.cuda.pdl=off")
    args = ap.parse_args()
    import transformers
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "transformers": transformers.__version__, "commit": os.environ.get("KILN_COMMIT", "")}
    bw = hbm_bandwidth_gbs()
    meta["hbm_bandwidth_gbs"] = bw
    rows = []
    for name in args.models.split(","):
        try:
            rows.append(bench_model(args, name, bw))
        except Exception as e:  # keep the other model's figures
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:500]}"})
        print(json.dumps(rows[-1]), flush=True)
    out = os.path.join(os.environ.get("OUT", "/tmp"), "llm_gpu_bench.json")
    json.dump({"meta": meta, "results": rows}, open(out, "w"), indent=1)
    print(f"\nHBM bandwidth {bw:.0f} GB/s  ({meta['gpu']}, commit {meta['commit']})")
    print(f"{'model':<9}{'params':>8}{'greedy=HF':>10}{'b1 ms/tok':>10}{'BW limit':>9}{'ratio':>7}{'HF b1 t/s':>10}{'Kiln c64 t/s':>13}{'HF c64 t/s':>11}{'x HF':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<9} error: {r['error'][:200]}")
            continue
        def f(key, width, spec):
            return f"{r[key]:>{width}{spec}}" if key in r else f"{'-':>{width}}"
        print(f"{r['model']:<9}{r['params'] / 1e9:>7.2f}B{r['greedy_tokens_identical_prefix']:>10}{f('kiln_b1_tpot_ms', 10, '.3f')}{f('bandwidth_limit_ms', 9, '.3f')}"
              f"{f('b1_vs_bandwidth_limit', 7, '.2f')}{f('hf_b1_tokens_per_s', 10, '.0f')}{f('kiln_c64_tokens_per_s', 13, '.0f')}{f('hf_c64_tokens_per_s', 11, '.0f')}"
              f"{f('c64_speedup_vs_hf', 6, '.2f')}")
        if "kiln_b1_tpot_ms_no_pdl" in r:
            print(f"{'':<9}b1 ms/token without PDL: {r['kiln_b1_tpot_ms_no_pdl']:.3f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Peer runners and the summary for bench/adam_vs_peers.sh (never run in CI).

  adam_peers.py check                      which peers import/build here, with reasons (JSON)
  adam_peers.py run --peer P --params N --threads T --repeat R
                                           one JSON line: the median step time of peer P
  adam_peers.py summarize RESULTS.jsonl    table + ratios against the issue's targets

Peers (one flat fp32 tensor of N parameters, fp32 gradients, the layout ZeRO-Offload uses):
  torch_foreach   torch.optim.AdamW(foreach=True)
  torch_fused     torch.optim.AdamW(fused=True) (CPU fused kernel, torch >= 2.4)
  torch_forloop   torch.optim.AdamW(foreach=False, fused=False)
  ds_step         DeepSpeedCPUAdam.step(): the plain fp32 AdamW step
  ds_full         DeepSpeed's full offloaded update: DeepSpeedCPUAdam.step() followed by the
                  separate fp32 -> bf16 copy of the parameters (bit16 params for the trip back)
  torch_fused_full  the same offloaded update built from PyTorch's best: fused AdamW + the copy
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_count(text):
    text = text.strip()
    mult = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}
    if text and text[-1].upper() in mult:
        return int(float(text[:-1]) * mult[text[-1].upper()])
    return int(float(text))


def bytes_per_param(peer):
    # Reads + writes per parameter: p, g, m, v read (16), p, m, v written (12); ds_full adds the
    # separate copy pass (read p 4, write bf16 2).
    return 34 if peer.endswith("_full") else 28


def check():
    out = {}
    try:
        import torch  # noqa: F401
        out["torch"] = {"ok": True, "version": torch.__version__}
        try:
            p = torch.zeros(16, requires_grad=True)
            p.grad = torch.zeros(16)
            torch.optim.AdamW([p], fused=True).step()
            out["torch_fused"] = {"ok": True}
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out["torch_fused"] = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
    except Exception as e:  # noqa: BLE001
        out["torch"] = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
    try:
        import deepspeed  # noqa: F401
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        import torch
        p = torch.nn.Parameter(torch.zeros(64))
        p.grad = torch.zeros(64)
        DeepSpeedCPUAdam([p], lr=1e-3).step()  # JIT-builds the C++ extension on first use
        out["deepspeed"] = {"ok": True, "version": deepspeed.__version__}
    except Exception as e:  # noqa: BLE001
        out["deepspeed"] = {"ok": False, "reason": f"{type(e).__name__}: {str(e)[:500]}"}
    print(json.dumps(out))


def run(peer, n, threads, repeat):
    import torch
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.randn(n, generator=g) * 0.02)
    p.grad = torch.randn(n, generator=g) * 1e-3
    p16 = None
    if peer.startswith("torch"):
        kw = {"foreach": peer == "torch_foreach"}
        if peer in ("torch_fused", "torch_fused_full"):
            kw = {"fused": True}
        elif peer == "torch_forloop":
            kw = {"foreach": False, "fused": False}
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kw)
        if peer == "torch_fused_full":
            p16 = torch.empty(n, dtype=torch.bfloat16)
    else:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=0.01, adamw_mode=True)
        if peer == "ds_full":
            p16 = torch.empty(n, dtype=torch.bfloat16)

    def step():
        with torch.no_grad():
            opt.step()
            if p16 is not None:
                p16.copy_(p)  # DeepSpeed's separate 16-bit copy-back pass

    step()  # warm-up: allocates the states
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    bpp = bytes_per_param(peer)
    print(json.dumps({
        "bench": "adam_peer", "peer": peer, "params": n, "threads": threads, "repeat": repeat,
        "step_s_median": med, "step_s_min": min(times), "step_s_max": max(times),
        "params_per_s": n / med, "bytes_per_param": bpp, "gbps": n * bpp / med / 1e9,
        "torch": torch.__version__,
    }))


def summarize(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    by = {}
    for r in rows:
        if r.get("bench") == "adam":
            key = "tierzero_fused_bf16" if r["grad_dtype"] == "bf16" else "tierzero_fp32"
            by.setdefault(key, []).append(r)
        elif r.get("bench") == "adam_peer":
            by.setdefault(r["peer"], []).append(r)
    med = {k: statistics.median(x["params_per_s"] for x in v) for k, v in by.items()}
    print(f"{'runner':<22} {'rounds':>6} {'Mparams/s':>10} {'B/param':>8} {'GB/s':>7}")
    for k, v in sorted(by.items()):
        gb = statistics.median(x["gbps"] for x in v)
        print(f"{k:<22} {len(v):>6} {med[k] / 1e6:>10.1f} {v[0]['bytes_per_param']:>8} {gb:>7.2f}")
    out = {}
    if "tierzero_fp32" in by:
        f = statistics.median(x["fraction_of_ceiling"] for x in by["tierzero_fp32"])
        out["tierzero_fp32_fraction_of_ceiling"] = f
        print(f"tierzero fp32 AdamW: {f:.3f} of the same-run ceiling (target >= 0.9)")
    if "tierzero_fused_bf16" in by:
        f = statistics.median(x["fraction_of_ceiling"] for x in by["tierzero_fused_bf16"])
        out["tierzero_fused_fraction_of_ceiling"] = f
    if "tierzero_fused_bf16" in med and "ds_full" in med:
        r = med["tierzero_fused_bf16"] / med["ds_full"]
        out["fused_vs_ds_full"] = r
        print(f"tierzero fused bf16-grad + bf16 copy vs DeepSpeed step + copy: {r:.2f}x "
              "(target >= 1.15x)")
    if "tierzero_fp32" in med and "ds_step" in med:
        r = med["tierzero_fp32"] / med["ds_step"]
        out["fp32_vs_ds_step"] = r
        print(f"tierzero fp32 AdamW vs DeepSpeedCPUAdam fp32 step: {r:.2f}x")
    if "tierzero_fused_bf16" in med and "torch_fused_full" in med:
        r = med["tierzero_fused_bf16"] / med["torch_fused_full"]
        out["fused_vs_torch_fused_full"] = r
        print(f"tierzero fused bf16-grad + bf16 copy vs PyTorch fused AdamW + copy: {r:.2f}x")
    torch_best = max((med[k] for k in ("torch_foreach", "torch_fused", "torch_forloop")
                      if k in med), default=None)
    if torch_best and "tierzero_fp32" in med:
        r = med["tierzero_fp32"] / torch_best
        out["fp32_vs_torch_best"] = r
        print(f"tierzero fp32 AdamW vs PyTorch's best CPU AdamW: {r:.2f}x (target >= 3x)")
    for k in ("torch_forloop", "torch_foreach"):
        if k in med and "tierzero_fp32" in med:
            out[f"fp32_vs_{k}"] = med["tierzero_fp32"] / med[k]
            print(f"tierzero fp32 AdamW vs {k}: {out[f'fp32_vs_{k}']:.2f}x")
    print(json.dumps({"bench": "adam_vs_peers_summary", **out}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    r = sub.add_parser("run")
    r.add_argument("--peer", required=True,
                   choices=["torch_foreach", "torch_fused", "torch_forloop", "torch_fused_full",
                            "ds_step", "ds_full"])
    r.add_argument("--params", default="256M")
    r.add_argument("--threads", type=int, default=os.cpu_count())
    r.add_argument("--repeat", type=int, default=5)
    s = sub.add_parser("summarize")
    s.add_argument("path")
    a = ap.parse_args()
    if a.cmd == "check":
        check()
    elif a.cmd == "run":
        run(a.peer, parse_count(a.params), a.threads, a.repeat)
    else:
        summarize(a.path)


if __name__ == "__main__":
    sys.exit(main())

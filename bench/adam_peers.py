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
    """Ratios are medians of per-round ratios: within a round the runners are minutes apart at
    most, so a change in the machine's memory bandwidth (shared host) cancels out."""
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    rounds = []
    for r in rows:
        if r.get("bench") == "round" or not rounds:
            rounds.append({})
        if r.get("bench") == "adam":
            key = "tierzero_fused_bf16" if r["grad_dtype"] == "bf16" else "tierzero_fp32"
        elif r.get("bench") == "adam_peer":
            key = r["peer"]
        else:
            continue
        rounds[-1][key] = r
    rounds = [x for x in rounds if x]
    keys = sorted({k for x in rounds for k in x})
    print(f"{'runner':<22} {'rounds':>6} {'Mparams/s (median)':>19} {'B/param':>8} {'GB/s':>7}")
    for k in keys:
        v = [x[k] for x in rounds if k in x]
        pps = statistics.median(x["params_per_s"] for x in v)
        gb = statistics.median(x["gbps"] for x in v)
        print(f"{k:<22} {len(v):>6} {pps / 1e6:>19.1f} {v[0]['bytes_per_param']:>8} {gb:>7.2f}")

    def ratio(a, b):
        rs = [x[a]["params_per_s"] / x[b]["params_per_s"] for x in rounds if a in x and b in x]
        return (statistics.median(rs), rs) if rs else (None, [])

    out = {}
    for key, name in (("tierzero_fp32", "fp32"), ("tierzero_fused_bf16", "fused")):
        fr = [x[key]["fraction_of_ceiling"] for x in rounds if key in x]
        if fr:
            out[f"tierzero_{name}_fraction_of_ceiling"] = statistics.median(fr)
            print(f"tierzero {name}: {statistics.median(fr):.3f} of the same-run ceiling "
                  f"(per round {', '.join(f'{f:.3f}' for f in fr)}; target for fp32 >= 0.9)")
    comparisons = [
        ("tierzero_fused_bf16", "ds_full", "fused bf16-grad + bf16 copy vs DeepSpeed step + copy",
         " (target >= 1.15x)"),
        ("tierzero_fused_bf16", "torch_fused_full", "fused vs PyTorch fused AdamW + copy", ""),
        ("tierzero_fp32", "ds_step", "fp32 AdamW vs DeepSpeedCPUAdam fp32 step", ""),
        ("tierzero_fp32", "torch_fused", "fp32 AdamW vs torch AdamW(fused=True)", ""),
        ("tierzero_fp32", "torch_foreach", "fp32 AdamW vs torch AdamW(foreach=True)", ""),
        ("tierzero_fp32", "torch_forloop", "fp32 AdamW vs torch AdamW (for-loop)", ""),
    ]
    for a, b, text, target in comparisons:
        med, rs = ratio(a, b)
        if med is not None:
            out[f"{a}_vs_{b}"] = med
            print(f"tierzero {text}: {med:.2f}x{target} (per round "
                  f"{', '.join(f'{r:.2f}' for r in rs)})")
    best = [max(x[k]["params_per_s"] for k in ("torch_fused", "torch_foreach", "torch_forloop")
                if k in x) for x in rounds if "tierzero_fp32" in x and any(
                    k in x for k in ("torch_fused", "torch_foreach", "torch_forloop"))]
    rs = [x["tierzero_fp32"]["params_per_s"] / b for x, b in zip(
        [x for x in rounds if "tierzero_fp32" in x and any(
            k in x for k in ("torch_fused", "torch_foreach", "torch_forloop"))], best)]
    if rs:
        out["tierzero_fp32_vs_torch_best"] = statistics.median(rs)
        print(f"tierzero fp32 AdamW vs PyTorch's best CPU AdamW: {statistics.median(rs):.2f}x "
              "(target >= 3x)")
    print(json.dumps({"bench": "adam_vs_peers_summary", "rounds": len(rounds), **out}))


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

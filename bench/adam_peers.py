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
    """Each peer ran next to the tierzero mode it is compared with (a pair, adam_vs_peers.sh);
    a ratio is the median over rounds of the ratio within each pair, so the shared host's
    drifting memory bandwidth cancels out."""
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    pairs = []  # [{"peer": name, "tz": row, "peer_row": row}]
    for r in rows:
        if r.get("bench") == "pair":
            pairs.append({"peer": r["peer"], "tz_mode": r["tierzero"]})
        elif pairs and r.get("bench") == "adam":
            pairs[-1]["tz"] = r
        elif pairs and r.get("bench") == "adam_peer":
            pairs[-1]["peer_row"] = r
    pairs = [p for p in pairs if "tz" in p and "peer_row" in p]
    by_runner = {}
    for p in pairs:
        by_runner.setdefault(p["tz_mode"], []).append(p["tz"])
        by_runner.setdefault(p["peer"], []).append(p["peer_row"])
    print(f"{'runner':<18} {'runs':>5} {'Mparams/s (median)':>19} {'B/param':>8} {'GB/s':>7}")
    for k, v in sorted(by_runner.items()):
        pps = statistics.median(x["params_per_s"] for x in v)
        gb = statistics.median(x["gbps"] for x in v)
        print(f"{k:<18} {len(v):>5} {pps / 1e6:>19.1f} {v[0]['bytes_per_param']:>8} {gb:>7.2f}")
    out = {}
    for mode in ("tz_fp32", "tz_fused"):
        fr = [x["fraction_of_ceiling"] for x in by_runner.get(mode, [])]
        if fr:
            out[f"{mode}_fraction_of_ceiling"] = statistics.median(fr)
            print(f"{mode}: {statistics.median(fr):.3f} of the same-run ceiling (median of "
                  f"{len(fr)} runs, min {min(fr):.3f}, max {max(fr):.3f})")
    targets = {"ds_full": " (target >= 1.15x)"}
    ratios = {}
    for p in pairs:
        ratios.setdefault((p["tz_mode"], p["peer"]), []).append(
            p["tz"]["params_per_s"] / p["peer_row"]["params_per_s"])
    for (mode, peer), rs in ratios.items():
        med = statistics.median(rs)
        out[f"{mode}_vs_{peer}"] = med
        print(f"{mode} vs {peer}: {med:.2f}x{targets.get(peer, '')} "
              f"(per round {', '.join(f'{r:.2f}' for r in rs)})")
    torch_keys = [k for k in ("tz_fp32_vs_torch_fused", "tz_fp32_vs_torch_foreach",
                              "tz_fp32_vs_torch_forloop") if k in out]
    if torch_keys:
        worst = min(out[k] for k in torch_keys)
        out["tz_fp32_vs_torch_best"] = worst
        print(f"tz_fp32 vs PyTorch's best CPU AdamW: {worst:.2f}x (target >= 3x)")
    print(json.dumps({"bench": "adam_vs_peers_summary", "pairs": len(pairs), **out}))


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

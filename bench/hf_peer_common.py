"""The Hugging Face peers' common side of bench/llama_vs_hf.sh and bench/lora_vs_peft.sh: loading a
folder in fp32, llm.c's token files and batch order, the cross-entropy, K steps of AdamW with
clipping as the DeepSpeed config says, the ids and the loss of an unseen batch, and the per-step
loss verdict. Each script's peer.py imports it (the script puts bench/ on PYTHONPATH); the verdict
also runs as `python hf_peer_common.py loss_verdict BENCH PEER TZ_JSONL PEER_JSONL [FAMILY]`.
torch, transformers and numpy come from the throw-away venv of bench/peers_venv.sh (never CI)."""
import json
import sys

import numpy as np
import torch
import transformers


def load(path):
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                 attn_implementation="eager")
    except TypeError:
        return transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                                 attn_implementation="eager")


def write_tokens(path, n, seed):
    # llm.c's format: 256 int32 header (magic 20240520, version 1, count), then uint16 tokens.
    toks = np.random.default_rng(int(seed)).integers(0, 256, size=n).astype("<u2")
    header = np.zeros(256, dtype="<i4"); header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(header.tobytes()); f.write(toks.tobytes())


def read_tokens(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    return np.fromfile(path, dtype="<u2", offset=1024, count=int(header[2])).astype(np.int64)


def batch(toks, b, B, T):
    # llm.c's order on one rank (as tierzero's loader): sequences b*B .. b*B+B-1.
    rounds = ((toks.size - 1) // T) // B
    first = (b % rounds) * B
    x = np.stack([toks[(first + r) * T:(first + r) * T + T] for r in range(B)])
    y = np.stack([toks[(first + r) * T + 1:(first + r) * T + T + 1] for r in range(B)])
    return torch.from_numpy(x), torch.from_numpy(y)


def ce(m, x, y):
    logits = m(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train(model_and_params, config, tokens, steps, B, T, out):
    """`steps` steps of torch.optim.AdamW and clip_grad_norm_ as the DeepSpeed `config` file says,
    on llm.c's batches of `tokens`; model_and_params() gives the model (in training mode) and the
    parameters to train. One JSON line a step to `out`: step, loss, gradient norm."""
    torch.set_num_threads(2)
    cfg = json.load(open(config)); o = cfg["optimizer"]["params"]
    m, params = model_and_params()
    opt = torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                            weight_decay=o["weight_decay"])
    toks = read_tokens(tokens)
    with open(out, "w") as f:
        for step in range(int(steps)):
            x, y = batch(toks, step, int(B), int(T))
            opt.zero_grad(set_to_none=True)
            loss = ce(m, x, y); loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, cfg["gradient_clipping"])
            opt.step()
            f.write(json.dumps({"step": step + 1, "loss": loss.item(), "grad_norm": norm.item()}) + "\n")


def cmd_ids(tokens, b, B, T, out):
    x, y = batch(read_tokens(tokens), int(b), int(B), int(T))
    json.dump({"tokens": x.tolist(), "targets": y.tolist()}, open(out, "w"))


def cmd_eval(folder, ids_file):
    ids = json.load(open(ids_file))
    with torch.no_grad():
        print(ce(load(folder).eval(), torch.tensor(ids["tokens"]), torch.tensor(ids["targets"])).item())


def run_command(commands):
    """argv[1] names the command: commands["cmd_" + argv[1]](*argv[2:])."""
    commands["cmd_" + sys.argv[1]](*sys.argv[2:])


def cmd_loss_verdict(bench, peer, tz_file, peer_file, family=None):
    """tierzero's per-step losses against the peer's: one JSON line, pass when every step is
    within 1e-4 relative."""
    tz = [json.loads(l)["loss"] for l in open(tz_file)]
    pt = [json.loads(l)["loss"] for l in open(peer_file)]
    d = [abs(a - b) / abs(b) for a, b in zip(tz, pt)]
    ok = len(tz) == len(pt) and max(d) <= 1e-4
    line = {"bench": bench}
    if family is not None:
        line["family"] = family
    line.update({"case": "loss_per_step", "steps": len(pt), "max_rel_diff": max(d), "bound": 1e-4,
                 "tierzero": tz, peer: pt, "pass": ok})
    print(json.dumps(line))


if __name__ == "__main__":
    run_command(globals())

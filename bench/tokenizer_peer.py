#!/usr/bin/env python3
"""HF `tokenizers` side of bench/tokenizer_vs_hf.sh (run in its throw-away venv).

  train  CORPUS OUT_DIR VOCAB        trains the tokenizers of each kind into OUT_DIR/<kind>/
  ids    TOKENIZER TEXT TOKENS.bin   exits 1 unless HF's ids of the whole TEXT equal the file's
  time   TOKENIZER TEXT REPEAT       prints tokens/s of encode_batch over TEXT's lines (median)
"""
import array
import json
import os
import statistics
import struct
import sys
import time

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines(keepends=True)


def save(tok, out_dir, kind):
    os.makedirs(os.path.join(out_dir, kind), exist_ok=True)
    tok.save(os.path.join(out_dir, kind, "tokenizer.json"))


def train(corpus, out_dir, vocab):
    lines = lines_of(corpus)
    # Byte-level BPE with a Split regex (Llama 3 / Qwen 2), ignore_merges as Llama 3 ships it.
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    save(tok, out_dir, "bytelevel_split")
    # The same model with 65,100 added tokens: ids past 65,535 (version 2 token files).
    tok.add_special_tokens([AddedToken("<extra_%d>" % i, normalized=False) for i in range(65100)])
    save(tok, out_dir, "bytelevel_65k")
    # GPT-2: ByteLevel with its own regex.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    save(tok, out_dir, "gpt2")
    # SentencePiece-style (Llama 2): Prepend + Replace, byte_fallback with <0x..> in the vocab.
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"]
    tok.train_from_iterator([l.rstrip("\n") for l in lines], trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, limit_alphabet=100, show_progress=False))
    j = json.loads(tok.to_str())
    old = j["model"]["vocab"]
    order = sorted(old, key=lambda t: old[t])
    new = {t: i for i, t in enumerate(order[:3])}
    for b in range(256):
        new["<0x%02X>" % b] = len(new)
    for t in order[3:]:
        new.setdefault(t, len(new))
    j["model"]["vocab"] = new
    os.makedirs(os.path.join(out_dir, "sentencepiece"), exist_ok=True)
    with open(os.path.join(out_dir, "sentencepiece", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    # Metaspace pre-tokenizer form (Mistral v0.3), the same vocabulary.
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    os.makedirs(os.path.join(out_dir, "metaspace"), exist_ok=True)
    with open(os.path.join(out_dir, "metaspace", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def ids(tok_path, text_path, bin_path):
    tok = Tokenizer.from_file(tok_path)
    with open(text_path, encoding="utf-8", newline="") as f:
        text = f.read()
    want = tok.encode(text, add_special_tokens=False).ids
    with open(bin_path, "rb") as f:
        b = f.read()
    magic, version, count = struct.unpack("<iii", b[:12])
    got = array.array("H" if version == 1 else "I", b[1024:]).tolist()
    if got == want:
        print("ids equal: %d tokens, version %d file, max id %d" % (count, version, max(got)))
        return 0
    first = next((i for i, (a, c) in enumerate(zip(got, want)) if a != c), min(len(got), len(want)))
    print("ids DIFFER: tierzero %d tokens, HF %d; first difference at %d: %s vs %s" %
          (len(got), len(want), first, got[first:first + 8], want[first:first + 8]))
    return 1


def timing(tok_path, text_path, repeat):
    tok = Tokenizer.from_file(tok_path)
    lines = lines_of(text_path)
    # Batches of 1,000 lines: encode_batch parallelizes over them (RAYON_NUM_THREADS threads).
    batches = [lines[i:i + 1000] for i in range(0, len(lines), 1000)]
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = 0
        for b in batches:
            n += sum(len(e.ids) for e in tok.encode_batch(b, add_special_tokens=False))
        rates.append(n / (time.perf_counter() - t0))
    print("%.0f" % statistics.median(rates))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "ids":
        sys.exit(ids(sys.argv[2], sys.argv[3], sys.argv[4]))
    elif cmd == "time":
        timing(sys.argv[2], sys.argv[3], int(sys.argv[4]))

#!/usr/bin/env python3
"""Writes the tokenizer test data: small tokenizer.json files trained by HF `tokenizers` on the KJV
Bible, and expected.json with HF's ids and decoded text for each test string. Run it in a
throw-away venv (never in CI); the outputs are committed:

  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
  bible -f "Gen1:1-Rev22:21" | sed 's/^[A-Za-z0-9]*:[0-9]* //' > /tmp/kjv.txt
  /tmp/tokvenv/bin/python tests/data/tokenizer/make_expected.py /tmp/kjv.txt tests/data/tokenizer
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers, AddedToken
import tokenizers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
EXTRA = ["café naïve résumé über straße", "中文字符测试，日本語のテキスト", "don't I'll we've",
         "numbers 1234567 and 3.14159", "tab\there  two  spaces"]


def corpus(path, lines=3000):
    with open(path, encoding="utf-8") as f:
        out = [next(f) for _ in range(lines)]
    return out + EXTRA * 20


def save(tok, out_dir, name, edit=None):
    j = json.loads(tok.to_str())
    if edit:
        edit(j)
    path = os.path.join(out_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return Tokenizer.from_file(path)


def merges_as_strings(j):
    j["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1] for m in j["model"]["merges"]]


def byte_level(lines, out_dir):
    # GPT-2 style: ByteLevel with its own regex, merges written as "a b" strings.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, tr)
    files = {"gpt2.json": save(tok, out_dir, "gpt2.json", merges_as_strings)}

    def prefix(j):
        merges_as_strings(j)
        j["pre_tokenizer"]["add_prefix_space"] = True
    files["gpt2_prefix_space.json"] = save(tok, out_dir, "gpt2_prefix_space.json", prefix)

    # Added tokens with each flag on top of the GPT-2 file, and an NFKC normalizer so that
    # `normalized` tokens match the normalized text.
    tok.normalizer = normalizers.NFKC()
    tok.add_special_tokens([AddedToken("<|special|>", normalized=False)])
    tok.add_tokens([AddedToken("[LS]", lstrip=True, normalized=False),
                    AddedToken("[RS]", rstrip=True, normalized=False),
                    AddedToken("hello", single_word=True, normalized=False),
                    AddedToken("ﬁx", normalized=True),
                    AddedToken("<a>", normalized=False),
                    AddedToken("<a><b>", normalized=False),
                    AddedToken("[BOTH]", lstrip=True, rstrip=True, normalized=False)])
    files["added_tokens.json"] = save(tok, out_dir, "added_tokens.json", merges_as_strings)
    return files


def llama3(lines, out_dir):
    # Llama 3 / Qwen 2 style: NFC, Split(regex) + ByteLevel without regex, ignore_merges, merges
    # written as ["a", "b"] pairs.
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, tr)

    def pairs(j):
        j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    return {"llama3.json": save(tok, out_dir, "llama3.json", pairs)}


def sentencepiece(lines, out_dir):
    # Llama 2 style: Prepend + Replace normalizers, no pre-tokenizer, byte_fallback with <0x..>
    # tokens in the model's vocab, and the Replace/ByteFallback/Fuse/Strip decoder.
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=80, show_progress=False)
    # SentencePiece trains on lines without their newline, so "\n" is left to byte fallback.
    tok.train_from_iterator([line.rstrip("\n") for line in lines], tr)

    def byte_tokens(j):
        # Llama 2 keeps <0x00>..<0xFF> in the model's vocab right after the three specials.
        vocab = j["model"]["vocab"]
        order = sorted(vocab, key=lambda t: vocab[t])
        new = {}
        for t in order[:3]:
            new[t] = len(new)
        for b in range(256):
            new["<0x%02X>" % b] = len(new)
        for t in order[3:]:
            if t not in new:
                new[t] = len(new)
        j["model"]["vocab"] = new
    files = {"llama2.json": save(tok, out_dir, "llama2.json", byte_tokens)}

    def metaspace(scheme, split, name, nfkc):
        def edit(j):
            byte_tokens(j)
            j["normalizer"] = {"type": "NFKC"} if nfkc else None
            j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                                  "split": split}
            j["decoder"] = {"type": "Sequence", "decoders": [
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split},
                {"type": "ByteFallback"}, {"type": "Fuse"}]}
        files[name] = save(tok, out_dir, name, edit)
    metaspace("always", True, "metaspace.json", True)
    metaspace("first", False, "metaspace_first.json", False)
    return files


TEXTS = [
    "", " ", "   ", "\n", "\n\n\t  \n", "Hello world", "hello", " hello",
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.\nAnd God saw the light.\n\nThe end.",
    "e\u0301te\u0301 cafe\u0301 caf\u00e9 A\u030a",
    "emoji 😀👍🏽 and 🧑‍🚀!",
    "中文字符测试，日本語のテキスト、한국어",
    "line one\r\nline two\r\n\r\nthree",
    "  leading and trailing spaces  ",
    "numbers 1234567 and 3.14159, 10,000",
    "don't I'll we've THEY'RE she'S",
    "tab\there\u00a0nbsp\u0085nel\u2028ls\u3000ideographic",
    "ﬁne ｆｕｌｌｗｉｄｔｈ ①②",
    "a\nb\n\nc\n \nd  \n\te",
    "x" * 300,
    "    indented code:\n        return x  # comment\n",
]
SPECIAL_TEXTS = {
    "gpt2.json": ["<|endoftext|>Hello world<|endoftext|>", "<|endoftext|><|endoftext|>", " <|endoftext|> x "],
    "gpt2_prefix_space.json": ["<|endoftext|>Hello world<|endoftext|>", "a<|endoftext|>b"],
    "llama3.json": ["<|begin_of_text|>Hello<|end_of_text|>", "<|begin_of_text|> The\n<|end_of_text|>"],
    "llama2.json": ["<s>Hello world</s>", "<s> x</s> y", "<unk>"],
    "metaspace.json": ["<s>Hello world</s>", "a</s> b"],
    "metaspace_first.json": ["<s>Hello world</s>", "a</s> b"],
    "added_tokens.json": [
        "<|special|>start and end<|special|>", "a [LS] b", "a   [LS]b", "a [RS]   b", "x[RS]\n\ny",
        "hello world", "sayhello hello!", "hello_x hello", "(hello)", "<a><b> <a> <a><b><a>",
        "fix the ﬁx", "a  [BOTH]  b", "[LS][LS] [RS][RS]  z", "<|special|>"],
}


def main():
    kjv, out_dir = sys.argv[1], sys.argv[2]
    lines = corpus(kjv)
    files = {}
    files.update(byte_level(lines, out_dir))
    files.update(llama3(lines, out_dir))
    files.update(sentencepiece(lines, out_dir))
    expected = {"tokenizers_version": tokenizers.__version__, "files": {}}
    for name, tok in sorted(files.items()):
        cases = []
        for text in TEXTS + SPECIAL_TEXTS.get(name, []):
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
        expected["files"][name] = cases
    with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

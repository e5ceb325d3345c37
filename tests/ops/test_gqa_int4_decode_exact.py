"""A genai int4 Llama (accuracy_level 4) decodes token-exact against onnxruntime for 64
steps, logits within 1e-4 of the largest (and bit for bit where MLAS takes its AVX2
kernels, whose arithmetic workbench reproduces: `mlas_isa.isa()` "avx2" or "avx512").

The CI-sized stand-in for SmolLM2-135M's onnxruntime-genai int4 CPU export
(tools/compare_logits.py runs that one): the built-in builder's Llama in
onnxruntime-genai's builder interface (packed-free Q/K/V projections, GroupQueryAttention
with rotary inside, SkipSimplifiedLayerNormalization, SiLU as Sigmoid x Mul, MatMulNBits
everywhere at accuracy_level 4: each requantizes its input to int8 per block of 32, so
one ulp anywhere upstream shows). Two layouts: the tiny default (head size 16) and one
with SmolLM2's attention (9 query heads, 3 KV heads, head size 64). Two workbench loops
against onnxruntime's plain run() loop (2 intra-op threads): the same plain loop
(growing caches, the general one-token path) and ``Generator(kv="fixed")`` (caches
bound in place, the prepared call); the rounding is the session's default ("auto": this
model requantizes activations, so onnxruntime's rounding is on).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import workbench
import workbench.models
from workbench import Generator
from workbench.ops import mlas_isa

STEPS = 64
PROMPT = [1, 17, 99, 250, 3, 42, 7, 300]
EXACT = mlas_isa.isa() in ("avx2", "avx512")
LAYOUTS = {"tiny": {}, "smollm2-attention": dict(heads=9, kv_heads=3, head_dim=64, hidden=576)}


def _model(layout: str):
    model = workbench.models.llama("tiny", flavor="genai", quant="int4", export="genai-builder", **LAYOUTS[layout])
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            next(a for a in node.attribute if a.name == "accuracy_level").i = 4
    return model


def _run_loop(session, head_size: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decode with plain run() calls, present -> past (the genai builder's smoke test)."""
    pasts = sorted(i.name for i in session.get_inputs() if i.name.startswith("past_key_values."))
    kv_heads = {i.name: i.shape[1] for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    feed = {"input_ids": np.array([PROMPT], np.int64), "attention_mask": np.ones((1, len(PROMPT)), np.int64)}
    feed.update({p: np.zeros((1, kv_heads[p], 0, head_size), np.float32) for p in pasts})
    tokens, logits, total = [], [], len(PROMPT)
    for _ in range(STEPS):
        out = dict(zip(names, session.run(None, feed)))
        row = np.asarray(out["logits"])[0, -1].astype(np.float32)
        logits.append(row)
        tokens.append(int(np.argmax(row)))
        total += 1
        feed = {"input_ids": np.array([[tokens[-1]]], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        feed.update({p: out[p.replace("past_key_values", "present")] for p in pasts})
    return tokens, logits


def _fixed_loop(session) -> tuple[list[int], list[np.ndarray]]:
    result = Generator(session).generate(PROMPT, STEPS, kv="fixed", progress=False, return_logits=True,
                                         eos_token_id=-1)
    return list(result.tokens), [np.asarray(r, np.float32) for r in result.logits]


@pytest.mark.parametrize("loop", ["run", "fixed"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_int4_level4_llama_decodes_token_exact_with_onnxruntimes_logits(layout, loop):
    model = _model(layout)
    head_size = LAYOUTS[layout].get("head_dim", 16)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    peer = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want_tokens, want_logits = _run_loop(peer, head_size)
    ours = workbench.InferenceSession(model.SerializeToString())
    assert ours.executor.onnxruntime_rounding, "a model that requantizes activations rounds as onnxruntime"
    got_tokens, got_logits = _run_loop(ours, head_size) if loop == "run" else _fixed_loop(ours)
    assert got_tokens == want_tokens
    worst = max(float(np.abs(g.astype(np.float64) - w).max() / np.abs(w).max())
                for g, w in zip(got_logits, want_logits, strict=True))
    assert worst <= 1e-4, worst
    if EXACT:
        for step, (g, w) in enumerate(zip(got_logits, want_logits)):
            np.testing.assert_array_equal(g, w, err_msg=f"step {step}")

"""The `io_buffers` frame: where each step's feeds, bound outputs and graph outputs
live, with the buffer underneath — so a KV cache that never moves can be seen not to."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from builtin_models import BUILT_IN, PROMPT

import workbench
from workbench import Generator, reports


def test_a_fixed_kv_cache_keeps_its_buffer_and_decodes_token_exact():
    data = BUILT_IN["llama-genai"]().SerializeToString()
    session = workbench.InferenceSession(data)
    got = Generator(session).generate(PROMPT, 12, progress=False, eos_token_id=-1, kv="fixed")
    want = Generator(ort.InferenceSession(data, providers=["CPUExecutionProvider"])).generate(
        PROMPT, 12, progress=False, eos_token_id=-1, kv="fixed")
    assert got.tokens == want.tokens
    io = session.recording.table("io_buffers")
    names = {v.id: v.name for v in session.graph.values}
    past = io[io.value_id.map(names).str.startswith("past_key_values.0.key") & (io.role == "feed")]
    assert len(past) == 12
    assert past.base_address.nunique() == 1, "the cache buffer never moves"
    assert (past.base_nbytes >= past.nbytes).all()
    growth = reports.kv_growth(session.recording)
    assert growth[growth.io == "past"].capacity.nunique() == 1


def test_every_feed_and_output_is_listed_each_step():
    session = workbench.InferenceSession(BUILT_IN["gpt2"]().SerializeToString())
    Generator(session).generate(PROMPT, 4, progress=False, eos_token_id=-1)
    io = session.recording.table("io_buffers")
    per_step = io.groupby("step").size()
    expected = len(session.graph.inputs) + len(session.graph.outputs)
    assert (per_step == expected).all()
    assert set(io.role) == {"feed", "output"}
    assert (io.address > 0).all() and np.all(io.base_nbytes >= io.nbytes)

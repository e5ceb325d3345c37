"""A growing KV cache's presents are handed to the caller, not copied
(`Executor.output_for_caller`): the executor must never write into an array it
handed over. Every test keeps every array a run returned, runs on, and only then
compares all of them with onnxruntime's, so a later step writing into an earlier
step's present (or a retried step into the first try's) shows as a difference.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import workbench
from workbench import SessionOptions, models

RUNS = 8


def _decode_by_hand(session, model_inputs, prompt, steps, rng, repeat_at=None):
    """Greedy-free decode loop through `run`: input_ids and position_ids are the same
    two arrays every step (new contents), the pasts are the last step's presents. At
    step `repeat_at` the same feeds run twice. Returns every step's outputs, as given."""
    names = [i.name for i in model_inputs]
    kv_inputs = [n for n in names if n.startswith("past_key_values")]
    ids = np.empty((1, len(prompt)), np.int64)
    ids[...] = prompt
    feeds = {"input_ids": ids, "attention_mask": np.ones((1, len(prompt)), np.int64)}
    if "position_ids" in names:
        feeds["position_ids"] = np.arange(len(prompt), dtype=np.int64)[None]
    for n in kv_inputs:
        feeds[n] = np.zeros((1, 2, 0, 16), np.float32)
    token_ids, positions = np.empty((1, 1), np.int64), np.empty((1, 1), np.int64)
    kept = []
    length = len(prompt)
    for step in range(steps):
        outputs = session.run(None, feeds)
        kept.append(outputs)
        if step == repeat_at:
            kept.append(session.run(None, feeds))
        presents = dict(zip([o.name for o in session.get_outputs()], outputs))
        token_ids[...] = rng.integers(3, 60)
        positions[...] = length
        length += 1
        feeds = {"input_ids": token_ids, "attention_mask": np.ones((1, length), np.int64)}
        if "position_ids" in names:
            feeds["position_ids"] = positions
        for n in kv_inputs:
            feeds[n] = presents[n.replace("past_key_values", "present")]
    return kept


def _compare(ours, theirs):
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for i, (x, y) in enumerate(zip(a, b)):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=f"step {step} output {i}")


@pytest.mark.parametrize("flavor", ["onnx", "genai"])
@pytest.mark.parametrize("options", [{}, {"capture": False}, {"trace": False}, {"view_plan": False}])
def test_handed_over_presents_stay_what_their_step_computed(flavor, options):
    data = models.llama("tiny", flavor=flavor).SerializeToString()
    ours = workbench.InferenceSession(data, SessionOptions(**options))
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = _decode_by_hand(ours, ours.get_inputs(), [3, 7, 11, 5], RUNS, np.random.default_rng(0))
    want = _decode_by_hand(peer, ours.get_inputs(), [3, 7, 11, 5], RUNS, np.random.default_rng(0))
    _compare(got, want)
    handed = [arr for outputs in got for arr in outputs[1:]]
    buffers = [b for state in ours.executor.slots.values() for b in state.buffers.values()]
    assert not any(b is a for a in handed for b in buffers), "the executor keeps no handed-over array"
    later = got[2:]  # steps the memo replays: their presents were handed over, not copied
    assert all(ours.executor.arrays[v] is later[-1][k] for k, v in enumerate(ours.graph.outputs) if k > 0)
    assert len({id(a) for a in handed}) == len(handed)


def test_a_step_run_twice_leaves_the_first_runs_presents_alone():
    """The same feeds twice in a row (a retried step): the memo replays the same
    lengths, where a kept buffer would be reused; the first run's arrays must hold."""
    data = models.llama("tiny", flavor="onnx").SerializeToString()
    ours = workbench.InferenceSession(data, SessionOptions())
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = _decode_by_hand(ours, ours.get_inputs(), [3, 7, 11, 5], RUNS, np.random.default_rng(1), repeat_at=5)
    want = _decode_by_hand(peer, ours.get_inputs(), [3, 7, 11, 5], RUNS, np.random.default_rng(1), repeat_at=5)
    _compare(got, want)
    first, second = got[5], got[6]
    assert all(a is not b and not np.shares_memory(a, b) for a, b in zip(first, second))


@pytest.mark.cuda
def test_the_cuda_backend_hands_over_host_copies():
    """Device buffers are never the caller's: every output is a host copy, and the
    by-hand decode (the same arrays kept) still matches onnxruntime."""
    data = models.llama("tiny", flavor="onnx").SerializeToString()
    ours = workbench.InferenceSession(data, backend="cuda")
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = _decode_by_hand(ours, ours.get_inputs(), [3, 7, 11, 5], RUNS, np.random.default_rng(2))
    want = _decode_by_hand(peer, ours.get_inputs(), [3, 7, 11, 5], RUNS, np.random.default_rng(2))
    _compare(got, want)
    assert all(type(a) is np.ndarray for outputs in got for a in outputs)

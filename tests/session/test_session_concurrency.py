"""A session runs one decode at a time and any number of `run` calls safely: two
decodes on one session (two threads, or a notebook cell re-run while its first decode
streams) used to interleave their steps in one set of buffers, one memo and one
Recording: wrong tokens, shape KernelErrors, 'end_step() called without an open step'."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort

import workbench
from workbench import Generator, SessionBusyError, models

PROMPT = [3, 4, 5, 6]


def test_a_second_decode_on_a_busy_session_is_refused_and_the_first_is_unharmed():
    model = models.llama("tiny")
    want = Generator(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])) \
        .generate(PROMPT, 12, kv="growing", progress=False, eos_token_id=-1).tokens
    session = workbench.InferenceSession(model)
    started, release = threading.Event(), threading.Event()
    result: dict = {}

    def first_token(_token: int) -> None:
        started.set()
        release.wait(10)

    def decode() -> None:
        result["first"] = Generator(session).generate(PROMPT, 12, kv="fixed", progress=False, eos_token_id=-1,
                                                      on_token=first_token).tokens

    worker = threading.Thread(target=decode)
    worker.start()
    assert started.wait(10)
    try:
        Generator(session).generate(PROMPT, 4, progress=False)
        raised = None
    except SessionBusyError as error:
        raised = error
    finally:
        release.set()
        worker.join(20)
    assert raised is not None and "already running a Generator.generate decode" in str(raised)
    assert result["first"] == want
    # and once it is done the session decodes again, with the same tokens
    assert Generator(session).generate(PROMPT, 12, kv="fixed", progress=False, eos_token_id=-1).tokens == want


def test_run_calls_from_several_threads_each_get_their_own_values():
    model = models.llama("tiny")
    session = workbench.InferenceSession(model)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def feeds(seed: int) -> dict:
        r = np.random.default_rng(seed)
        out = {}
        for i in session.get_inputs():
            if i.name == "input_ids":
                out[i.name] = r.integers(0, 100, (1, 3)).astype(np.int64)
            elif i.name == "attention_mask":
                out[i.name] = np.ones((1, 5), np.int64)
            elif i.name == "position_ids":
                out[i.name] = np.arange(2, 5, dtype=np.int64)[None, :]
            else:
                shape = [1 if d in ("batch_size", "batch") else 2 if isinstance(d, str) else d for d in i.shape]
                out[i.name] = r.standard_normal(shape).astype(np.float32)
        return out

    errors: list = []

    def worker(base: int) -> None:
        try:
            for k in range(12):
                f = feeds(base * 100 + k)
                got = session.run(["logits"], f)[0]
                want = peer.run(["logits"], f)[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"thread {base} run {k}")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]

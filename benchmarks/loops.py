"""The two decode loops the benchmarks drive, for any session with onnxruntime's API
(a workbench `InferenceSession` or an `onnxruntime.InferenceSession`): `generator_loop`
(`Generator(kv="fixed")`) and `plain_loop` (a `session.run` loop as onnxruntime users
write it). Each returns (tokens, median ms per step after `WARM` steps)."""

from __future__ import annotations

import time

import numpy as np

from workbench import Generator

WARM = 6
PROMPT = [3, 4, 5, 6]


def generator_loop(session, prefill, tokens: int) -> tuple[list[int], float]:
    result = Generator(session, prefill=prefill).generate(PROMPT, tokens, kv="fixed", progress=False,
                                                          eos_token_id=-1)
    return result.tokens, float(np.median(result.step_times[WARM:])) * 1e3


def plain_loop(session, prefill, tokens: int) -> tuple[list[int], float]:
    """The loop an onnxruntime user writes: new arrays every step, nothing bound."""
    discovered = Generator(session, prefill=prefill)
    ids, length, out, times, presents = list(PROMPT), 0, [], [], {}
    for step in range(tokens):
        first = step == 0 and prefill is not None
        run = prefill if first else session
        run_io = discovered.prefill_interface if first else discovered.interface
        n = len(ids)
        feeds = {run_io.input_ids: np.array([ids], np.int64)}
        if run_io.attention_mask:
            feeds[run_io.attention_mask] = np.ones((1, length + n), run_io.dtypes[run_io.attention_mask])
        if run_io.position_ids:
            feeds[run_io.position_ids] = np.arange(length, length + n, dtype=np.int64)[None, :]
        if run_io.use_cache_branch:
            feeds[run_io.use_cache_branch] = np.array([length > 0])
        for s in run_io.kv:
            if s.past is None:
                continue
            shape = [d if isinstance(d, int) else 0 for d in s.shape]
            shape[0] = 1
            feeds[s.past] = presents.get((s.layer, s.kind), np.zeros(shape, s.dtype))
        t0 = time.perf_counter()
        res = dict(zip([o.name for o in run.get_outputs()], run.run(None, feeds)))
        times.append(time.perf_counter() - t0)
        presents = {(s.layer, s.kind): np.array(res[s.present]) for s in run_io.kv}
        token = int(np.argmax(res[run_io.logits][0, -1]))
        out.append(token)
        length += n
        ids = [token]
    return out, float(np.median(times[WARM:])) * 1e3

"""`workbench.compare`: one call answers "does this mechanism change any token?"."""

from __future__ import annotations

from builtin_models import BUILT_IN, PROMPT

import workbench
from workbench import SessionOptions
from workbench.backend.cpu import CpuBackend
from workbench.decode.compare import COLUMNS


def test_default_mechanisms_change_no_token_and_no_logit():
    frame = workbench.compare(BUILT_IN["llama-genai"](), PROMPT, 12,
                              b=SessionOptions(shadow="record", decode_memo_verify=False), kv="fixed")
    assert list(frame.columns) == COLUMNS
    assert len(frame) == 12 and frame.phase.iloc[0] == "prefill"
    assert frame.tokens_equal.all()
    assert frame.max_logits_err.max() < 1e-4
    assert (frame.first_divergent_node_b == "").all()


def test_a_replay_that_skips_work_shows_the_flip_and_names_the_first_divergent_node(monkeypatch):
    original = CpuBackend.launch

    def lossy_launch(self, graph):  # every long captured graph loses its middle launch
        if len(graph.launches) > 3:
            launches = list(graph.launches)
            del launches[len(launches) // 2]
            for fn, ins, outs in launches:
                fn(ins, outs)
            return None
        return original(self, graph)

    monkeypatch.setattr(CpuBackend, "launch", lossy_launch)
    frame = workbench.compare(BUILT_IN["llama-genai"](), PROMPT, 10,
                              b=SessionOptions(shadow="record", decode_memo_verify=False), kv="fixed")
    assert frame.max_logits_err.max() > 0
    named = frame[frame.first_divergent_node_b != ""]
    assert len(named) > 0
    assert named.first_divergent_node_b.str.endswith("(capture_replay)").all()
    assert (frame.first_divergent_node_a == "").all(), "side a runs eagerly: nothing to diverge"

"""The CUDA backend (CuPy): same tokens as the CPU backend, captured graphs replay.

Marked `cuda`: skipped where CuPy or a usable GPU is missing. Run on a GPU machine
with `tools/gpu_check.sh`.
"""

from __future__ import annotations

import numpy as np
import pytest

import workbench
from workbench import Generator, SessionOptions, models

pytestmark = pytest.mark.cuda


def _gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:  # noqa: BLE001 - no CuPy, or CuPy without a driver
        return False


if not _gpu():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)

BUILT_IN = {
    "gpt2": lambda: models.gpt2("tiny"),
    "llama-onnx": lambda: models.llama("tiny", flavor="onnx"),
    "llama-genai": lambda: models.llama("tiny", flavor="genai"),
    "phi3": lambda: models.phi3("tiny"),
}
PROMPT = list(range(3, 11))


def _tokens(name: str, backend: str, **options) -> list[int]:
    session = workbench.InferenceSession(BUILT_IN[name]().SerializeToString(), backend=backend,
                                         options=SessionOptions(**options))
    return Generator(session).generate(PROMPT, 32, progress=False, eos_token_id=-1).tokens


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_cuda_decodes_the_same_tokens_as_the_cpu(name):
    assert _tokens(name, "cuda", capture=False) == _tokens(name, "cpu")


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_cuda_capture_replays_and_stays_token_exact(name):
    session = workbench.InferenceSession(BUILT_IN[name]().SerializeToString(), backend="cuda")
    got = Generator(session).generate(PROMPT, 32, progress=False, eos_token_id=-1, kv="fixed").tokens
    assert got == _tokens(name, "cpu")
    events = session.recording.capture_events()
    assert (events.event == "replay").sum() > 0, events.to_string()


def test_cuda_run_matches_onnxruntime_on_one_step():
    import onnxruntime as ort

    model = models.llama("tiny", flavor="genai").SerializeToString()
    cfg = models.config_of(models.llama("tiny", flavor="genai"))
    feeds = {"input_ids": np.array([[5, 6, 7]], np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    feeds.update(cfg.empty_past(1, 0))
    ours = workbench.InferenceSession(model, backend="cuda").run(["logits"], feeds)[0]
    peer = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    np.testing.assert_allclose(ours, peer, rtol=1e-4, atol=1e-4)

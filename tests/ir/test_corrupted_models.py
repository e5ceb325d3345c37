"""Corrupted copies of valid exports fail cleanly: a WorkbenchError that says something, or a run.

Each case flips bytes (one or several, anywhere / in the node list / in the weights /
in the graph's input-output declarations) or truncates a built-in model's serialized
bytes, loads it with `InferenceSession`, and if it loads, runs one prefill step with
the feeds the *intact* model expects. Whatever happens must be a `WorkbenchError`
subclass with a non-empty message (or success), never another exception type, never
a hang (a per-case alarm turns a hang into a loud failure).
"""

from __future__ import annotations

import functools
import random
import signal
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

import workbench
from workbench import WorkbenchError
from workbench import models as builtin

CASES_PER_GROUP = 100
CASE_TIMEOUT_S = 20


class Hang(BaseException):
    """Raised by the per-case alarm; a BaseException so no `except Exception` can swallow it."""


@functools.cache
def _model(name: str) -> onnx.ModelProto:
    if name == "llama":
        return builtin.llama("tiny", flavor="onnx")
    return builtin.gpt2("tiny")


@functools.cache
def _intact(name: str) -> bytes:
    return _model(name).SerializeToString()


@functools.cache
def _regions(name: str) -> dict[str, tuple[int, int]]:
    """Byte ranges of the serialized model: the node list, the weights, the declarations."""
    data, graph = _intact(name), _model(name).graph
    first = data.find(graph.node[0].SerializeToString())
    last_node = graph.node[-1].SerializeToString()
    nodes_end = data.find(last_node) + len(last_node)
    decl = data.find(graph.input[0].SerializeToString())
    assert 0 < first < nodes_end < decl < len(data)
    return {"anywhere": (0, len(data)), "nodes": (first, nodes_end), "weights": (nodes_end, decl),
            "declarations": (decl, len(data))}


def _feeds(name: str) -> dict[str, np.ndarray]:
    """Prefill feeds for the intact model: batch 1, 3 prompt tokens, empty KV cache."""
    session = workbench.InferenceSession(_intact(name))
    sizes = {"batch_size": 1, "sequence_length": 3, "total_sequence_length": 3, "past_sequence_length": 0}
    feeds = {}
    for arg in session.get_inputs():
        shape = tuple(d if isinstance(d, int) else sizes[d] for d in arg.shape)
        if arg.name == "input_ids":
            feeds[arg.name] = np.array([[3, 4, 5]], np.int64)
        elif arg.name == "position_ids":
            feeds[arg.name] = np.arange(3, dtype=np.int64)[None, :]
        elif arg.type == "tensor(int64)":
            feeds[arg.name] = np.ones(shape, np.int64)
        else:
            feeds[arg.name] = np.zeros(shape, np.float32)
    return feeds


def _flip(rng: random.Random, data: bytes, lo: int, hi: int, count: int) -> bytes:
    out = bytearray(data)
    for _ in range(count):
        i = rng.randrange(lo, hi)
        out[i] = out[i] ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
    return bytes(out)


def _corrupt(rng: random.Random, data: bytes, kind: str, regions: dict) -> bytes:
    if kind == "truncate":
        return data[: rng.randrange(len(data))]
    if kind == "flip1":
        return _flip(rng, data, *regions["anywhere"], 1)
    if kind == "flip_many":
        return _flip(rng, data, *regions["anywhere"], rng.randint(2, 16))
    return _flip(rng, data, *regions[kind], rng.randint(1, 4))  # nodes / weights / declarations


def _outcome(load, feeds: dict) -> str | None:
    """Load (and run) one corrupted model; None when it behaved, else what went wrong."""

    def on_alarm(signum, frame):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(CASE_TIMEOUT_S)
    stage = "load"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # garbage weights overflow, which numpy warns about
            session = load()
            stage = "run"
            session.run(None, feeds)
        return None
    except WorkbenchError as e:
        return None if str(e).strip() else f"{stage}: {type(e).__name__} with an empty message"
    except Hang:
        return f"{stage}: no result after {CASE_TIMEOUT_S} s (hang?)"
    except Exception as e:  # noqa: BLE001 - the point: nothing but a WorkbenchError may escape
        return f"{stage}: {type(e).__name__}: {str(e)[:200]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


KINDS = ["flip1", "flip_many", "truncate", "nodes", "weights", "declarations"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_corrupted_bytes_fail_cleanly(name, kind):
    data, regions, feeds = _intact(name), _regions(name), _feeds(name)
    rng = random.Random(f"{name}/{kind}")
    bad = []
    for case in range(CASES_PER_GROUP):
        corrupted = _corrupt(rng, data, kind, regions)
        problem = _outcome(lambda c=corrupted: workbench.InferenceSession(c), feeds)
        if problem:
            bad.append(f"case {case}: {problem}")
    assert not bad, f"{name}/{kind}: {len(bad)} of {CASES_PER_GROUP} corrupted copies escaped:\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def external_llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("external")
    model = onnx.ModelProto()
    model.CopyFrom(_model("llama"))
    onnx.save_model(model, folder / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=256)
    assert (folder / "weights.bin").stat().st_size > 100_000
    return folder


def test_external_data_model_loads_and_runs(external_llama):
    session = workbench.InferenceSession(external_llama / "model.onnx")
    (logits, *_) = session.run(None, _feeds("llama"))
    reference = workbench.InferenceSession(_intact("llama")).run(None, _feeds("llama"))[0]
    np.testing.assert_array_equal(logits, reference)


@pytest.mark.parametrize("target", ["model", "weights"])
@pytest.mark.parametrize("kind", ["flip_many", "truncate"])
def test_corrupted_external_data_model_fails_cleanly(external_llama, tmp_path, target, kind):
    model_bytes = (external_llama / "model.onnx").read_bytes()
    weight_bytes = (external_llama / "weights.bin").read_bytes()
    rng = random.Random(f"external/{target}/{kind}")
    feeds = _feeds("llama")
    bad = []
    for case in range(CASES_PER_GROUP // 2):
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        original = model_bytes if target == "model" else weight_bytes
        corrupted = _corrupt(rng, original, kind, {"anywhere": (0, len(original))})
        (folder / "model.onnx").write_bytes(corrupted if target == "model" else model_bytes)
        (folder / "weights.bin").write_bytes(corrupted if target == "weights" else weight_bytes)
        problem = _outcome(lambda f=folder: workbench.InferenceSession(f / "model.onnx"), feeds)
        if problem:
            bad.append(f"case {case}: {problem}")
    assert not bad, f"external {target}/{kind}: {len(bad)} corrupted copies escaped:\n" + "\n".join(bad)


def test_truncated_weights_file_names_the_tensor(external_llama, tmp_path):
    (tmp_path / "model.onnx").write_bytes((external_llama / "model.onnx").read_bytes())
    weights = (external_llama / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(workbench.ModelLoadError, match=r"initializer '.+'.*weights.bin.*past its end"):
        workbench.InferenceSession(tmp_path / "model.onnx")

"""Decoders made by the exporters users run (torch.onnx legacy and dynamo, optimum,
transformers' exporter, onnxruntime-genai's builder, onnxruntime's optimizer), as
`tools/real_exports.py` builds them in a venv of its own (torch is never a dependency
of this suite): each decodes onnxruntime's tokens on the CPU backend, and on
backend="cuda" (the device double without a GPU) the CPU backend's tokens with capture
on under `shadow="raise"`; and where an exporter writes torch's scaled_dot_product_attention
op by op, the load-time rule makes it one node per layer.

The set lives outside the repository (WORKBENCH_REAL_EXPORTS, default
/tmp/real_exports, with its manifest.json); where it has not been built these tests
are not collected as passes: each reports a skip naming the command that builds it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import workbench
from workbench import SessionOptions
from workbench.decode.interface import find_export

FOLDER = Path(os.environ.get("WORKBENCH_REAL_EXPORTS", "/tmp/real_exports"))
TOKENS = 12


def _entries(keep=lambda name: True) -> list:
    manifest = FOLDER / "manifest.json"
    if not manifest.is_file():
        return [pytest.param(None, id="no-real-exports", marks=pytest.mark.skip(
            reason=f"no {manifest}: build the set with `python tools/real_exports.py --out {FOLDER}`"))]
    return [pytest.param(entry, id=entry["name"]) for entry in json.loads(manifest.read_text()) if keep(entry["name"])]


def _path(entry: dict) -> Path:
    """The export's file or folder; the manifest's absolute path, or the same below
    FOLDER when the set was moved (carried to a GPU machine with the checkout)."""
    path = Path(entry["path"])
    if path.exists() or entry["name"] not in path.parts:
        return path
    return FOLDER.joinpath(*path.parts[path.parts.index(entry["name"]):])


def _decode(entry: dict, backend: str, options: SessionOptions) -> tuple[list[int], workbench.InferenceSession]:
    files = find_export(_path(entry))
    session = workbench.InferenceSession(str(files.decode), options, backend=backend)
    prefill = None
    if files.prefill is not None:
        prefill = workbench.InferenceSession(str(files.prefill), options, backend=backend)
    generator = workbench.Generator(session, prefill=prefill)
    result = generator.generate(entry["prompt"], len(entry["ort_tokens"]), kv="fixed", progress=False,
                                eos_token_id=-1)
    return result.tokens, session


@pytest.mark.parametrize("entry", _entries())
def test_a_real_export_decodes_onnxruntimes_tokens_on_the_cpu(entry):
    tokens, _ = _decode(entry, "cpu", SessionOptions())
    assert tokens == entry["ort_tokens"], f"{entry['name']}: {tokens} vs onnxruntime {entry['ort_tokens']}"


@pytest.mark.cuda
@pytest.mark.parametrize("entry", _entries())
def test_a_real_export_decodes_the_cpu_tokens_on_the_device_under_shadow(entry):
    want, _ = _decode(entry, "cpu", SessionOptions())
    got, session = _decode(entry, "cuda", SessionOptions(shadow="raise", trace=True))
    assert got == want, f"{entry['name']}: cuda {got} vs cpu {want}"
    assert session.recording.divergences().empty


def _attention_in_the_rules_idiom(name: str) -> bool:
    """The exports whose decomposed scaled_dot_product_attention the load-time rule
    `fusion_attention` takes as one node per layer: torch.onnx's (legacy and dynamo),
    optimum's and transformers' exporter's. onnxruntime's own fusions and the genai
    builder write fused attention ops already."""
    return "ortcpu" not in name and name.startswith(("torch-legacy-", "torch-dynamo-", "optimum-", "transformers-"))


def _attention_nodes(graph) -> int:
    return sum((n.op_type == "MaskedSoftmaxAttention") + sum(_attention_nodes(g) for g in n.subgraphs.values())
               for n in graph.nodes)


@pytest.mark.parametrize("entry", _entries(_attention_in_the_rules_idiom))
def test_a_real_exports_attention_is_one_node_per_layer(entry):
    files = find_export(_path(entry))
    session = workbench.InferenceSession(str(files.decode), SessionOptions())
    # optimum 1.x's merged decoder: both If branches, but gpt2's first-step branch writes
    # K^T as one Transpose [0, 2, 3, 1] of the heads' split, which the rule leaves
    per_branch = 2 if "merged" in entry["name"] and "gpt2" not in entry["name"] else 1
    assert _attention_nodes(session.graph) == entry["config"]["layers"] * per_branch

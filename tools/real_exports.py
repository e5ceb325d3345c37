#!/usr/bin/env python3
"""Build tiny random-initialised decoder LLMs exported by the tools users actually use.

    python tools/real_exports.py [--out /tmp/real_exports] [--venv /tmp/exporters-venv]
                                 [--only SUBSTRING] [--force] [--list]
                                 [--checkpoint HF_DIR --tag NAME]

Run it with any python 3.10+ (the repository's own is fine: this file imports nothing
but the standard library). Everything that needs torch runs in virtual environments
of its own, outside the repository, which the script creates when missing:

* `--venv` (default /tmp/exporters-venv): torch==2.13.0 (a CPU build on this
  machine's local wheel index; any other torch spec pulls GBs of CUDA wheels),
  transformers 5.24, onnxruntime-genai 0.18, onnx, onnxruntime, onnxscript, onnx-ir.
* `--venv` + "-optimum" (default /tmp/exporters-venv-optimum): optimum 2.1 +
  optimum-onnx 0.1, which need transformers < 4.58, so they get a venv of their own.
* `--venv` + "-optimum1" (default /tmp/exporters-venv-optimum1): optimum 1.27 with
  transformers 4.53, for the merged decoder optimum 1.x wrote (`--legacy`).

No Hugging Face hub: each architecture is a tiny config (hidden 64, 2 layers, 4 heads,
2 KV heads, vocab 512, 128 positions; gpt2 has no GQA: 4 KV heads) initialised at random
with a fixed seed (initializer_range 0.2, so greedy choices are not near-ties), saved
with `save_pretrained` under OUT/_hf/<arch> with a word-level tokenizer (the genai
builder wants one), and under OUT/_hf-optimum/<arch> and OUT/_hf-optimum1/<arch> the same
weights saved by those venvs' transformers; each export reads one of these folders.
Exporters:

    torch-legacy-<arch>    torch.onnx.export(dynamo=False) of a decoder-with-past wrapper
    torch-dynamo-<arch>    torch.onnx.export(dynamo=True) of the same wrapper
    optimum-<arch>         optimum-cli export onnx --task text-generation-with-past (optimum-onnx 0.1:
                           one model.onnx with past inputs)
    optimum-merged-<arch>  optimum 1.27's optimum-cli export onnx --legacy: decoder_model_merged.onnx
                           (an If on use_cache_branch), with decoder_model.onnx and
                           decoder_with_past_model.onnx beside it
    transformers-<arch>    transformers.exporters.OnnxExporter().export_for_generation:
                           prefill.onnx + decode.onnx
    transformers-ortcpu-<arch>  the same with OnnxConfig(ort_fusions="cpu")
    genai-fp32-<arch>, genai-int4-<arch>   python -m onnxruntime_genai.models.builder -e cpu
    ort-extended-<arch>    torch-dynamo-<arch> through an onnxruntime session at
                           ORT_ENABLE_EXTENDED with optimized_model_filepath
    ort-optimizer-gpt2     onnxruntime.transformers.optimizer.optimize_model(model_type="gpt2")
                           of torch-legacy-gpt2

Every export sits in OUT/<name>/ and is validated with plain onnxruntime: a 12-token
greedy decode of the prompt [1, 5, 9, 3] (present -> past), whose tokens go into
OUT/manifest.json (`ort_tokens`, with the smallest top-1/top-2 logit margin met, and the
tokens torch itself decodes from the same checkpoint, `torch_tokens`). An export that
fails to build or that onnxruntime cannot run is left out of the manifest and listed in
OUT/failures.json with its error (a built but unrunnable one is moved to OUT/_dropped/).
manifest.json is a list of {"name", "exporter", "arch", "path" (the model file, or the
folder of a prefill + decode pair), "precision", "config": {hidden, layers, heads,
kv_heads, vocab}, "notes", "prompt", "ort_tokens", "torch_tokens", "min_margin", and per
graph ("model", or "prefill" and "decode"): "nodes" (top level), "nodes_with_subgraphs",
"ops" (op type -> count, subgraphs included), "opset", "inputs", "outputs"; "build_seconds"}.
Notable: optimum-onnx 0.1 writes no merged decoder any more (optimum-merged-* comes from
optimum 1.27, with two torch 2.13 shims noted in its "notes"); transformers 5.24 has its own
exporter (transformers.exporters, prefill.onnx + decode.onnx); genai int4's tokens differ
from torch's (quantised weights), every other export decodes torch's tokens.

`--checkpoint HF_DIR --tag NAME` exports a real checkpoint as it is instead (torch.onnx
legacy and dynamo, optimum; named <exporter>-NAME, its sizes from its config.json), e.g.
SmolLM2-135M as ../shared/tools/make_smollm2_genai.sh converts it from its GGUF; give it
an `--out` of its own, since the manifest lists the exports of one plan.

Idempotent: an export whose folder holds `_export.json` is kept unless `--force`.
Time on a 2-core VM: about 1.5 minutes to create the three venvs (pip, from the local
wheel index), then about 9.5 minutes for all 44 exports and their validation; a second
run with nothing to do takes under a second. Two runs from scratch give the same
manifest (weights, tokens, node counts). Survey them with workbench:
tools/real_export_survey.py; tests/decode/test_real_exports.py reads the same manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ARCHS = ("llama", "qwen2", "mistral", "phi3", "gpt2")
GENAI_ARCHS = ("llama", "qwen2", "mistral", "phi3")  # the genai builder has no gpt2
PROMPT = [1, 5, 9, 3]
NEW_TOKENS = 12
SEED = 1234

MAIN_PINS = ["torch==2.13.0", "transformers==5.24.0", "onnxruntime-genai==0.18.0", "onnx==1.23.2",
             "onnxruntime==1.32.0", "onnx-ir==1.1.0", "onnxscript==0.7.2", "accelerate==1.15.0"]
# optimum-onnx 0.1.0 requires optimum~=2.1.0 and transformers<4.58
OPTIMUM_PINS = ["torch==2.13.0", "transformers==4.57.6", "optimum==2.1.0", "optimum-onnx==0.1.0",
                "onnx==1.23.2", "onnxruntime==1.32.0"]
# optimum 1.27, the last optimum with the exporter inside (and `--legacy`: the merged decoder with
# `use_cache_branch` that optimum 1.x wrote by default for years), on the transformers of its time
OPTIMUM1_PINS = ["torch==2.13.0", "transformers==4.53.3", "optimum==1.27.0", "onnx==1.23.2", "onnxruntime==1.32.0",
                 "onnxscript==0.7.2", "onnx-ir==1.1.0", "accelerate==1.15.0"]

# --------------------------------------------------------------------------------------
# The code that runs inside the venvs (torch, transformers, onnxruntime). Written to
# OUT/_helper.py and run as `VENV/bin/python OUT/_helper.py COMMAND JSON-ARGS`.
HELPER = r'''
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SIZES = dict(hidden=64, layers=2, heads=4, kv_heads=2, vocab=512, positions=128, intermediate=128)


def sizes(arch):
    s = dict(SIZES)
    if arch == "gpt2":
        s["kv_heads"] = s["heads"]
    return s


def sizes_of(config):
    """The sizes of a loaded checkpoint's config (a tiny one's are `sizes(arch)`'s)."""
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    return dict(hidden=getattr(config, "hidden_size", None) or config.n_embd,
                layers=getattr(config, "num_hidden_layers", None) or config.n_layer, heads=heads,
                kv_heads=getattr(config, "num_key_value_heads", None) or heads, vocab=config.vocab_size)


def cmd_torch_tokens(a):
    """torch's greedy tokens for a checkpoint given as it is (`--checkpoint`), once."""
    from transformers import AutoModelForCausalLM
    out = Path(a["hf"]) / "torch_tokens.json"
    if not out.exists():
        model = AutoModelForCausalLM.from_pretrained(a["hf"]).eval()
        out.write_text(json.dumps(torch_greedy(model, a["prompt"], a["n"])))
    print(json.dumps({"torch_tokens": json.loads(out.read_text())}))


def make_config(arch):
    from transformers import AutoConfig
    s = sizes(arch)
    common = dict(vocab_size=s["vocab"], bos_token_id=1, eos_token_id=2, initializer_range=0.2)
    if arch == "gpt2":
        return AutoConfig.for_model("gpt2", n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
                                    n_positions=s["positions"], n_inner=s["intermediate"], **common)
    kw = dict(hidden_size=s["hidden"], intermediate_size=s["intermediate"], num_hidden_layers=s["layers"],
              num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
              max_position_embeddings=s["positions"], tie_word_embeddings=False, pad_token_id=0, **common)
    if arch == "phi3":
        kw["original_max_position_embeddings"] = s["positions"]
    if arch == "mistral":
        kw["sliding_window"] = None
    return AutoConfig.for_model(arch, **kw)


def torch_greedy(model, prompt, n):
    import torch
    ids = torch.tensor([prompt])
    out, past, toks = None, None, []
    with torch.no_grad():
        cur = ids
        for _ in range(n):
            out = model(input_ids=cur, past_key_values=past, use_cache=True)
            past = out.past_key_values
            t = int(out.logits[0, -1].argmax())
            toks.append(t)
            cur = torch.tensor([[t]])
    return toks


def cmd_hf(a):
    """A tiny random checkpoint for one arch (the optimum venv copies the main venv's weights)."""
    import torch
    from transformers import AutoModelForCausalLM
    out = Path(a["out"])
    torch.manual_seed(a["seed"])
    config = make_config(a["arch"])
    model = AutoModelForCausalLM.from_config(config).eval()
    if a.get("weights_from"):
        from safetensors.torch import load_file
        state = load_file(str(Path(a["weights_from"]) / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("lm_head.weight") and ".attn.bias" not in m
                   and "masked_bias" not in m]
        if missing or unexpected:
            raise SystemExit(f"weights of {a['weights_from']} do not fit: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(str(out))
    toks = torch_greedy(model, a["prompt"], a["n"])
    (out / "torch_tokens.json").write_text(json.dumps(toks))
    print(json.dumps({"torch_tokens": toks}))


def cmd_tokenizer(a):
    """A word-level tokenizer over the tiny vocab ("t3" ... "t511"): onnxruntime-genai's builder saves the
    checkpoint's tokenizer and fails without one; no hub, so it is made here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    special = ["<pad>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(special + [f"t{i}" for i in range(len(special), a["vocab"])])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<pad>")
    fast.save_pretrained(a["out"])
    print(json.dumps({"tokenizer": a["out"]}))


def decoder_with_past(model, layers):
    import torch
    from transformers import DynamicCache

    class DecoderWithPast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)])
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            presents = []
            for layer in out.past_key_values.layers:
                presents += [layer.keys, layer.values]
            return (out.logits, *presents)

    return DecoderWithPast().eval()


def cmd_torch(a):
    import torch
    from transformers import AutoModelForCausalLM
    out = Path(a["out"])
    model = AutoModelForCausalLM.from_pretrained(a["hf"]).eval()
    s = sizes_of(model.config)
    w = decoder_with_past(model, s["layers"])
    batch, seq, past = 2, 3, 5
    hd = s["hidden"] // s["heads"]
    args = [torch.randint(3, s["vocab"], (batch, seq)), torch.ones(batch, past + seq, dtype=torch.int64),
            torch.arange(past, past + seq).unsqueeze(0).expand(batch, seq).contiguous()]
    names_in = ["input_ids", "attention_mask", "position_ids"]
    names_out = ["logits"]
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            "position_ids": {0: "batch_size", 1: "sequence_length"},
            "logits": {0: "batch_size", 1: "sequence_length"}}
    for i in range(s["layers"]):
        for kind in ("key", "value"):
            args.append(torch.randn(batch, s["kv_heads"], past, hd))
            n_in, n_out = f"past_key_values.{i}.{kind}", f"present.{i}.{kind}"
            names_in.append(n_in)
            names_out.append(n_out)
            axes[n_in] = {0: "batch_size", 2: "past_sequence_length"}
            axes[n_out] = {0: "batch_size", 2: "total_sequence_length"}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.onnx"
    notes = []
    with torch.no_grad():
        if a["dynamo"]:
            # dynamic_axes cannot be converted here ("Failed to convert 'dynamic_axes' to 'dynamic_shapes'"):
            # named Dims, and Dim.AUTO for the mask's past + sequence length
            from torch.export import Dim
            B, S, P = Dim("batch_size"), Dim("sequence_length"), Dim("past_sequence_length")
            shapes = {"input_ids": {0: B, 1: S}, "attention_mask": {0: B, 1: Dim.AUTO}, "position_ids": {0: B, 1: S},
                      "past": tuple({0: B, 2: P} for _ in range(2 * s["layers"]))}
            torch.onnx.export(w, tuple(args), str(path), dynamo=True, input_names=names_in, output_names=names_out,
                              dynamic_shapes=shapes, opset_version=a.get("opset", 18), external_data=False)
            notes.append(f"torch.onnx.export(dynamo=True, dynamic_shapes=named Dims, opset {a.get('opset', 18)})")
        else:
            torch.onnx.export(w, tuple(args), str(path), dynamo=False, input_names=names_in,
                              output_names=names_out, dynamic_axes=axes, opset_version=a.get("opset", 17))
            notes.append(f"torch.onnx.export(dynamo=False, opset {a.get('opset', 17)}): TorchScript trace")
    print(json.dumps({"path": str(path), "notes": "; ".join(notes)}))


def cmd_optimum(a):
    out = Path(a["out"])
    cli = str(Path(sys.executable).parent / "optimum-cli")
    cmd = [cli, "export", "onnx", "--model", a["hf"], "--task", "text-generation-with-past", str(out)]
    if a.get("legacy"):  # optimum 1.x: decoder_model + decoder_with_past_model, merged into one with an If
        cmd = [sys.executable, "-c", OPTIMUM1_SHIM, "export", "onnx", "--legacy", *cmd[3:]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
    if r.returncode:
        raise SystemExit(f"optimum-cli failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    files = sorted(p.name for p in out.glob("*.onnx"))
    pick = next((f for f in ("decoder_model_merged.onnx", "model.onnx", "decoder_with_past_model.onnx")
                 if f in files), None)
    if pick is None:
        raise SystemExit(f"optimum wrote no model I know: {files}")
    import optimum.version
    flags = (" --legacy (torch.onnx.export defaulted to dynamo=False, torch.onnx.symbolic_opset14's private names "
             "restored: optimum 1.27 predates torch 2.13)") if a.get("legacy") else ""
    print(json.dumps({"path": str(out / pick), "notes": f"optimum {optimum.version.__version__}: optimum-cli export onnx"
                      f"{flags} wrote {files}; using {pick}"}))


# optimum 1.27 predates torch 2.13: it imports private helpers from torch.onnx.symbolic_opset14 (moved to
# torch.onnx._internal.torchscript_exporter) and calls torch.onnx.export expecting the TorchScript exporter,
# which torch >= 2.9 no longer picks by default. Both are put back before its CLI runs.
OPTIMUM1_SHIM = """
import sys
import torch.onnx
import torch.onnx.symbolic_opset14 as pub
import torch.onnx._internal.torchscript_exporter.symbolic_opset14 as priv
for n in dir(priv):
    if not hasattr(pub, n):
        setattr(pub, n, getattr(priv, n))
_export = torch.onnx.export
def _legacy_export(*a, **k):
    k.setdefault("dynamo", False)
    return _export(*a, **k)
torch.onnx.export = _legacy_export
from optimum.commands.optimum_cli import main
sys.argv = ["optimum-cli"] + sys.argv[1:]
main()
"""


def cmd_transformers(a):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.exporters import OnnxConfig, OnnxExporter
    out = Path(a["out"])
    model = AutoModelForCausalLM.from_pretrained(a["hf"]).eval()
    inputs = {"input_ids": torch.tensor([[1, 5, 9, 3, 7, 11]]), "attention_mask": torch.ones(1, 6, dtype=torch.int64)}
    kw = {"dynamic": True}
    if a.get("ort_fusions"):
        kw["ort_fusions"] = a["ort_fusions"]
    exported = OnnxExporter().export_for_generation(model, inputs, OnnxConfig(**kw))
    exported.save_pretrained(str(out))
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    print(json.dumps({"path": str(out), "notes": f"OnnxExporter().export_for_generation(OnnxConfig({kw})) wrote {files}"}))


def cmd_genai(a):
    out = Path(a["out"])
    r = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", a["hf"], "-o", str(out),
                        "-p", a["precision"], "-e", "cpu", "-c", a["cache"]], capture_output=True, text=True)
    sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
    if r.returncode or not (out / "model.onnx").is_file():
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise SystemExit(f"genai builder failed ({r.returncode}): {lines[-1] if lines else ''}")
    print(json.dumps({"path": str(out / "model.onnx"),
                      "notes": f"onnxruntime_genai.models.builder -p {a['precision']} -e cpu"}))


def cmd_ort_extended(a):
    import onnxruntime as ort
    out = Path(a["out"])
    out.mkdir(parents=True, exist_ok=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out / "model.onnx")
    ort.InferenceSession(a["src"], so, providers=["CPUExecutionProvider"])
    print(json.dumps({"path": str(out / "model.onnx"),
                      "notes": f"onnxruntime {ort.__version__} session at ORT_ENABLE_EXTENDED, optimized_model_filepath, "
                               f"from {a['src']}"}))


def cmd_ort_optimizer(a):
    from onnxruntime.transformers.optimizer import optimize_model
    out = Path(a["out"])
    out.mkdir(parents=True, exist_ok=True)
    s = sizes(a["arch"])
    m = optimize_model(a["src"], model_type=a["model_type"], num_heads=s["heads"], hidden_size=s["hidden"],
                       opt_level=a.get("opt_level", 0))
    m.save_model_to_file(str(out / "model.onnx"))
    print(json.dumps({"path": str(out / "model.onnx"),
                      "notes": f"onnxruntime.transformers.optimizer.optimize_model(model_type={a['model_type']!r}, "
                               f"opt_level={a.get('opt_level', 0)}) of {a['src']}; fused: {m.get_fused_operator_statistics()}"}))


# -- validation with plain onnxruntime --------------------------------------------------
_KIND = r"(key|value|keys|values)"
PAST = [rf"^past_key_values\.(\d+)\.{_KIND}$", rf"^past\.(\d+)\.{_KIND}$", rf"^past_{_KIND}_(\d+)$",
        rf"^past_key_values_(\d+)_{_KIND}$", rf"^input\.cache\.layers\.(\d+)\.{_KIND}$",
        rf"^past_key_values\.layers\.(\d+)\.{_KIND}$"]
PRESENT = [rf"^present\.(\d+)\.{_KIND}$", rf"^present_key_values\.(\d+)\.{_KIND}$", rf"^present_{_KIND}_(\d+)$",
           rf"^present_(\d+)_{_KIND}$", rf"^output\.cache\.layers\.(\d+)\.{_KIND}$", rf"^cache\.layers\.(\d+)\.{_KIND}$"]
NP = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
      "tensor(float16)": np.float16, "tensor(bool)": np.bool_}


def _kv(name, pats):
    for p in pats:
        m = re.match(p, name)
        if m:
            x, y = m.groups()
            layer, kind = (int(x), y) if x.isdigit() else (int(y), x)
            return layer, kind.rstrip("s")
    return None


class Step:
    """One onnxruntime session and the roles of its inputs."""

    def __init__(self, path, s):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.inputs = self.sess.get_inputs()
        self.outputs = [o.name for o in self.sess.get_outputs()]
        self.s = s
        self.past = {i.name: _kv(i.name, PAST) for i in self.inputs if _kv(i.name, PAST)}
        self.present = {o: _kv(o, PRESENT) for o in self.outputs if _kv(o, PRESENT)}
        known = {"input_ids", "attention_mask", "position_ids", "use_cache_branch", "cache_position"}
        other = [i.name for i in self.inputs if i.name not in known and i.name not in self.past]
        if other:
            raise SystemExit(f"inputs with no role: {other}")
        self.logits = "logits" if "logits" in self.outputs else self.outputs[0]

    def run(self, ids, past_len, cache):
        """ids: the new tokens; cache: {(layer, kind): array} (empty at the start)."""
        feed = {}
        seq = len(ids)
        for i in self.inputs:
            t = NP.get(i.type, np.float32)
            if i.name == "input_ids":
                feed[i.name] = np.array([ids], t)
            elif i.name == "attention_mask":
                feed[i.name] = np.ones((1, past_len + seq), t)
            elif i.name == "position_ids":
                feed[i.name] = np.arange(past_len, past_len + seq, dtype=t)[None]
            elif i.name == "cache_position":
                feed[i.name] = np.arange(past_len, past_len + seq, dtype=t)
            elif i.name == "use_cache_branch":
                feed[i.name] = np.array([past_len > 0], np.bool_)
            else:
                key = self.past[i.name]
                if key in cache:
                    feed[i.name] = cache[key]
                else:
                    hd = self.s["hidden"] // self.s["heads"]
                    dims = [d if isinstance(d, int) else None for d in i.shape]
                    if len(dims) != 4:
                        raise SystemExit(f"{i.name}: rank {len(dims)} past, expected 4")
                    shape = [1, dims[1] or self.s["kv_heads"], 0, dims[3] or hd]
                    feed[i.name] = np.zeros(shape, t)
        outs = dict(zip(self.outputs, self.sess.run(None, feed)))
        new_cache = {self.present[o]: v for o, v in outs.items() if o in self.present}
        return outs[self.logits][0, -1].astype(np.float64), new_cache


def count_nodes(path):
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    ops = {}

    def walk(g):
        n = 0
        for node in g.node:
            n += 1
            key = (node.domain + "::" if node.domain not in ("", "ai.onnx") else "") + node.op_type
            ops[key] = ops.get(key, 0) + 1
            for at in node.attribute:
                if at.g is not None and at.g.node:
                    n += walk(at.g)
                for sg in at.graphs:
                    n += walk(sg)
        return n

    total = walk(m.graph)
    return dict(nodes=len(m.graph.node), nodes_with_subgraphs=total, ops=dict(sorted(ops.items())),
                opset={o.domain or "ai.onnx": o.version for o in m.opset_import},
                inputs=[i.name for i in m.graph.input], outputs=[o.name for o in m.graph.output],
                functions=len(m.functions))


def cmd_validate(a):
    p = Path(a["path"])
    s = a.get("sizes") or sizes(a["arch"])
    prompt, n = a["prompt"], a["n"]
    if p.is_dir():
        prefill, decode = Step(p / "prefill.onnx", s), Step(p / "decode.onnx", s)
        graphs = {"prefill": count_nodes(p / "prefill.onnx"), "decode": count_nodes(p / "decode.onnx")}
    else:
        prefill = decode = Step(p, s)
        graphs = {"model": count_nodes(p)}
    toks, margins, cache, past_len = [], [], {}, 0
    ids = list(prompt)
    for step in range(n):
        sess = prefill if step == 0 else decode
        logits, cache = sess.run(ids, past_len, cache)
        top = np.sort(logits)[-2:]
        margins.append(float(top[1] - top[0]))
        past_len += len(ids)
        t = int(np.argmax(logits))
        toks.append(t)
        ids = [t]
        if not cache:
            raise SystemExit("the model returned no present K/V")
    print(json.dumps({"ort_tokens": toks, "min_margin": min(margins), "graphs": graphs}))


if __name__ == "__main__":
    cmd, args = sys.argv[1], json.loads(sys.argv[2])
    globals()["cmd_" + cmd](args)
'''


# --------------------------------------------------------------------------------------
def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def ensure_venv(venv: Path, pins: list[str]) -> Path:
    py = venv / "bin" / "python"
    marker = venv / ".real_exports_ok"
    if py.exists() and marker.exists():
        return py
    log(f"creating {venv} with {' '.join(pins)}")
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=False)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *pins], check=True)
    marker.write_text(" ".join(pins) + "\n")
    return py


def helper(py: Path, out: Path, cmd: str, args: dict, log_file: Path, timeout: int = 1800) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore",
               TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    with open(log_file, "a") as lf:
        lf.write(f"\n==== {cmd} {json.dumps(args)}\n")
        lf.flush()
        r = subprocess.run([str(py), str(out / "_helper.py"), cmd, json.dumps(args)], stdout=subprocess.PIPE,
                           stderr=lf, text=True, timeout=timeout, env=env)
    if r.returncode:
        tail = log_file.read_text().strip().splitlines()
        raise RuntimeError(next((ln for ln in reversed(tail) if ln.strip()), f"exit {r.returncode}")
                           if tail else f"exit {r.returncode}")
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def plan() -> list[dict]:
    """Every export: name, exporter, arch, precision, which venv, and what to run."""
    jobs = []
    for arch in ARCHS:
        jobs.append(dict(name=f"torch-legacy-{arch}", exporter="torch.onnx (dynamo=False)", arch=arch,
                         precision="fp32", venv="main", cmd="torch", args=dict(dynamo=False)))
        jobs.append(dict(name=f"torch-dynamo-{arch}", exporter="torch.onnx (dynamo=True)", arch=arch,
                         precision="fp32", venv="main", cmd="torch", args=dict(dynamo=True)))
        jobs.append(dict(name=f"optimum-{arch}", exporter="optimum-onnx", arch=arch, precision="fp32",
                         venv="optimum", cmd="optimum", args={}))
        jobs.append(dict(name=f"optimum-merged-{arch}", exporter="optimum 1.x (--legacy, merged decoder)", arch=arch,
                         precision="fp32", venv="optimum1", cmd="optimum", args=dict(legacy=True)))
        jobs.append(dict(name=f"transformers-{arch}", exporter="transformers.exporters (OnnxExporter)", arch=arch,
                         precision="fp32", venv="main", cmd="transformers", args={}))
        jobs.append(dict(name=f"transformers-ortcpu-{arch}",
                         exporter="transformers.exporters (OnnxExporter, ort_fusions=cpu)", arch=arch,
                         precision="fp32", venv="main", cmd="transformers", args=dict(ort_fusions="cpu")))
        if arch in GENAI_ARCHS:
            for prec in ("fp32", "int4"):
                jobs.append(dict(name=f"genai-{prec}-{arch}", exporter="onnxruntime-genai builder", arch=arch,
                                 precision=prec, venv="main", cmd="genai", args=dict(precision=prec)))
        jobs.append(dict(name=f"ort-extended-{arch}", exporter="onnxruntime session (ORT_ENABLE_EXTENDED)",
                         arch=arch, precision="fp32", venv="main", cmd="ort_extended",
                         args=dict(src_job=f"torch-dynamo-{arch}")))
    jobs.append(dict(name="ort-optimizer-gpt2", exporter="onnxruntime.transformers.optimizer", arch="gpt2",
                     precision="fp32", venv="main", cmd="ort_optimizer",
                     args=dict(src_job="torch-legacy-gpt2", model_type="gpt2")))
    return jobs


def config_summary(arch: str) -> dict:
    return dict(hidden=64, layers=2, heads=4, kv_heads=4 if arch == "gpt2" else 2, vocab=512)


def checkpoint_plan(folder: Path, tag: str) -> list[dict]:
    """torch.onnx legacy and dynamo and optimum exports of a checkpoint as it is
    (`--checkpoint`: e.g. SmolLM2-135M, converted from its GGUF by
    ../shared/tools/make_smollm2_genai.sh), named <exporter>-<tag>."""
    config = json.loads((folder / "config.json").read_text())
    heads = config.get("num_attention_heads") or config["n_head"]
    sizes = dict(hidden=config.get("hidden_size") or config["n_embd"],
                 layers=config.get("num_hidden_layers") or config["n_layer"], heads=heads,
                 kv_heads=config.get("num_key_value_heads") or heads, vocab=config["vocab_size"])
    arch = config["model_type"]
    common = dict(arch=arch, precision="fp32", hf=str(folder), sizes=sizes)
    return [dict(name=f"torch-legacy-{tag}", exporter="torch.onnx (dynamo=False)", venv="main", cmd="torch",
                 args=dict(dynamo=False), **common),
            dict(name=f"torch-dynamo-{tag}", exporter="torch.onnx (dynamo=True)", venv="main", cmd="torch",
                 args=dict(dynamo=True), **common),
            dict(name=f"optimum-{tag}", exporter="optimum-onnx", venv="optimum", cmd="optimum", args={}, **common)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/real_exports")
    ap.add_argument("--venv", default="/tmp/exporters-venv")
    ap.add_argument("--only", default=None, help="build only exports whose name contains this")
    ap.add_argument("--force", action="store_true", help="rebuild exports already present")
    ap.add_argument("--list", action="store_true", help="print the planned exports and exit")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="export this Hugging Face checkpoint folder as it is instead of the tiny set "
                         "(torch.onnx legacy and dynamo, optimum), named <exporter>-<--tag>")
    ap.add_argument("--tag", default="checkpoint", help="with --checkpoint: the exports' name suffix")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    jobs = checkpoint_plan(args.checkpoint.resolve(), args.tag) if args.checkpoint else plan()
    if args.list:
        for j in jobs:
            print(j["name"])
        return 0
    selected = [j for j in jobs if args.only is None or args.only in j["name"]]
    out.mkdir(parents=True, exist_ok=True)
    (out / "_helper.py").write_text(textwrap.dedent(HELPER))
    (out / "_logs").mkdir(exist_ok=True)
    venvs = {"main": ensure_venv(Path(args.venv), MAIN_PINS)}
    if any(j["venv"] == "optimum" for j in selected):
        venvs["optimum"] = ensure_venv(Path(str(args.venv) + "-optimum"), OPTIMUM_PINS)
    if any(j["venv"] == "optimum1" for j in selected):
        venvs["optimum1"] = ensure_venv(Path(str(args.venv) + "-optimum1"), OPTIMUM1_PINS)
    failures_file = out / "failures.json"
    failures = json.loads(failures_file.read_text()) if failures_file.exists() else {}

    def checkpoint(arch: str, venv: str) -> Path:
        hf = out / "_hf" / arch
        lg = out / "_logs" / f"_hf-{arch}.log"
        if not (hf / "torch_tokens.json").exists():
            log(f"checkpoint {arch}")
            helper(venvs["main"], out, "hf", dict(arch=arch, out=str(hf), seed=SEED, prompt=PROMPT, n=NEW_TOKENS), lg)
        if not (hf / "tokenizer.json").exists():
            helper(venvs["main"], out, "tokenizer", dict(out=str(hf), vocab=512), lg)
        if venv == "main":
            return hf
        hf2 = out / f"_hf-{venv}" / arch
        if not (hf2 / "torch_tokens.json").exists():
            log(f"checkpoint {arch} ({venv} venv's transformers, same weights)")
            helper(venvs[venv], out, "hf", dict(arch=arch, out=str(hf2), seed=SEED, prompt=PROMPT, n=NEW_TOKENS,
                                                weights_from=str(hf)), lg)
        return hf2

    def built(name: str) -> dict | None:
        f = out / name / "_export.json"
        return json.loads(f.read_text()) if f.exists() else None

    def build(job: dict) -> dict | None:
        name, arch = job["name"], job["arch"]
        entry = built(name)
        if entry is not None and not args.force:
            return entry
        folder = out / name
        lg = out / "_logs" / f"{name}.log"
        lg.write_text("")
        if folder.exists():
            shutil.rmtree(folder)
        if job.get("hf"):  # a checkpoint as it is: torch's tokens computed once, beside it
            hf = Path(job["hf"])
            helper(venvs["main"], out, "torch_tokens", dict(hf=str(hf), prompt=PROMPT, n=NEW_TOKENS), lg)
        else:
            hf = checkpoint(arch, job["venv"])
        a = dict(job["args"], arch=arch, hf=str(hf), out=str(folder))
        if "src_job" in a:
            src = built(a.pop("src_job"))
            if src is None:
                raise RuntimeError(f"needs {job['args']['src_job']}, which did not build")
            a["src"] = src["path"]
        if job["cmd"] == "genai":
            a["cache"] = str(out / "_cache" / name)
        t0 = time.time()
        log(f"export {name}")
        res = helper(venvs[job["venv"]], out, job["cmd"], a, lg)
        build_s = time.time() - t0
        path = res["path"]
        log(f"validate {name} ({build_s:.0f} s to build)")
        try:
            val = helper(venvs["main"], out, "validate", dict(path=path, arch=arch, prompt=PROMPT, n=NEW_TOKENS,
                                                              sizes=job.get("sizes")), lg, timeout=600)
        except Exception as e:
            dropped = out / "_dropped" / name
            if dropped.exists():
                shutil.rmtree(dropped)
            dropped.parent.mkdir(exist_ok=True)
            shutil.move(str(folder), str(dropped))
            raise RuntimeError(f"onnxruntime cannot run it (moved to {dropped}): {e}") from None
        torch_tokens = json.loads((hf / "torch_tokens.json").read_text())
        notes = [res.get("notes", "")]
        if val["ort_tokens"] != torch_tokens:
            notes.append("onnxruntime's tokens differ from torch's on the same checkpoint")
        graphs = val["graphs"]
        entry = dict(name=name, exporter=job["exporter"], arch=arch, path=path, precision=job["precision"],
                     config=job.get("sizes") or config_summary(arch), notes="; ".join(n for n in notes if n), prompt=PROMPT,
                     ort_tokens=val["ort_tokens"], torch_tokens=torch_tokens, min_margin=round(val["min_margin"], 6),
                     nodes={g: v["nodes"] for g, v in graphs.items()},
                     nodes_with_subgraphs={g: v["nodes_with_subgraphs"] for g, v in graphs.items()},
                     ops={g: v["ops"] for g, v in graphs.items()},
                     opset={g: v["opset"] for g, v in graphs.items()},
                     inputs={g: v["inputs"] for g, v in graphs.items()},
                     outputs={g: v["outputs"] for g, v in graphs.items()},
                     build_seconds=round(build_s, 1))
        (folder / "_export.json").write_text(json.dumps(entry, indent=1))
        return entry

    for job in selected:
        try:
            build(job)
            failures.pop(job["name"], None)
        except Exception as e:  # noqa: BLE001 - every failure is reported, the rest still build
            msg = str(e).strip() or type(e).__name__
            failures[job["name"]] = msg
            log(f"FAILED {job['name']}: {msg}")
    manifest = [e for j in jobs if (e := built(j["name"])) is not None]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    failures_file.write_text(json.dumps(failures, indent=1))
    log(f"{len(manifest)} exports in {out / 'manifest.json'}; {len(failures)} failed (failures.json)")
    for e in manifest:
        print(f"  {e['name']:28s} nodes {e['nodes']}  tokens {e['ort_tokens']}")
    for name, msg in failures.items():
        print(f"  FAILED {name}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

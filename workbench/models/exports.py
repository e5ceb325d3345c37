"""Built-in decoders re-dressed in the exact decode interface of real exporters.

The graphs of `llama()` and friends keep their own (stable) interface; these
functions take such a model and rewrite its inputs and outputs the way a
particular exporter names and shapes them, so the Generator's discovery can be
tested against every idiom without the exporter installed:

    genai_builder(model, mask_dtype="int64")   onnxruntime-genai's model builder:
        past_key_values.N.key [batch_size, kv, past_sequence_length, 'kv_cache_dim']
        (the head size is symbolic), present.N.key, attention_mask int64 or int32
    fused_gqa_without_mask(model)               transformers' export after onnxruntime's CPU
        fusions: GroupQueryAttention, no attention_mask, present = past + n
    optimum_merged(model)                       optimum's merged decoder: one If on
        a `use_cache_branch` bool input picks the with-past or the no-past graph
    transformers_export(directory, ...)         transformers' ONNX exporter (dynamo):
        a folder with prefill.onnx + decode.onnx + config.json + export.json;
        cache.layers.N.keys / input.cache.layers.N.keys / output.cache.layers.N.keys,
        no attention_mask, dims like 's70', 's53 + s70' and numeric strings '2', '16'

None of them change a computation: each rewritten model decodes the same tokens as
the model it came from. The workbench config metadata is dropped (real exports do
not carry it); `transformers_export` writes a `config.json` instead.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .config import BATCH, CONFIG_KEY, PAST, SEQ, TOTAL, ModelBuildError, ModelConfig, config_of

GENAI_HEAD_DIM = "kv_cache_dim"


# -- helpers -----------------------------------------------------------------------------
def _graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)


def rename_values(model: onnx.ModelProto, mapping: dict[str, str]) -> onnx.ModelProto:
    """Rename values (graph I/O, node inputs and outputs, in every subgraph) in place."""
    for g in _graphs(model.graph):
        for vi in [*g.input, *g.output, *g.value_info]:
            vi.name = mapping.get(vi.name, vi.name)
        for node in g.node:
            node.input[:] = [mapping.get(n, n) for n in node.input]
            node.output[:] = [mapping.get(n, n) for n in node.output]
    return model


def _set_dims(vi: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        else:
            dim.dim_param = d


def drop_config(model: onnx.ModelProto) -> None:
    for i in reversed(range(len(model.metadata_props))):
        if model.metadata_props[i].key == CONFIG_KEY:
            del model.metadata_props[i]


def _by_name(items, name: str):
    return next(x for x in items if x.name == name)


def _remove_inputs(graph: onnx.GraphProto, names: set[str]) -> None:
    keep = [vi for vi in graph.input if vi.name not in names]
    del graph.input[:]
    graph.input.extend(keep)


def _prepend(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)


def _past_concats_to_identity(graph: onnx.GraphProto, pasts: set[str]) -> None:
    """`Concat(past, new)` -> `Identity(new)`: the graph of a first run (no cache)."""
    for node in graph.node:
        if node.op_type == "Concat" and node.input and node.input[0] in pasts:
            if len(node.input) != 2:
                raise ModelBuildError(f"node {node.name!r}: expected Concat(past, new)")
            new = node.input[1]
            node.op_type = "Identity"
            del node.input[:]
            node.input.append(new)
            del node.attribute[:]
    for node in graph.node:
        if any(n in pasts for n in node.input):
            raise ModelBuildError(f"node {node.name!r} reads the past KV cache outside a Concat")


def _kv_names(cfg: ModelConfig) -> list[tuple[int, str, str, str]]:
    """(layer, kind, past name, present name) of every KV tensor of a built-in model."""
    out = []
    for i in range(cfg.num_layers):
        for kind, past, present in zip(("key", "value"), cfg.past_names(i), cfg.present_names(i)):
            out.append((i, kind, past, present))
    return out


# -- onnxruntime-genai model builder --------------------------------------------------------
def genai_builder(model: onnx.ModelProto, *, mask_dtype: str = "int64") -> onnx.ModelProto:
    """A genai-flavour model with the builder's KV shapes: the head size is the symbol
    'kv_cache_dim'; `mask_dtype="int32"` makes `attention_mask` int32 (as builds for
    some execution providers do), cast to int64 where the mask subgraph starts."""
    cfg = config_of(model)
    if cfg.flavor != "genai":
        raise ModelBuildError(f"genai_builder: needs a flavor='genai' model, got flavor={cfg.flavor!r}")
    if mask_dtype not in ("int64", "int32"):
        raise ModelBuildError(f"genai_builder: mask_dtype must be 'int64' or 'int32', got {mask_dtype!r}")
    out = copy.deepcopy(model)
    g = out.graph
    for _, _, past, present in _kv_names(cfg):
        _set_dims(_by_name(g.input, past), [BATCH, cfg.kv_heads, PAST, GENAI_HEAD_DIM])
        _set_dims(_by_name(g.output, present), [BATCH, cfg.kv_heads, TOTAL, GENAI_HEAD_DIM])
    if mask_dtype == "int32":
        mask = _by_name(g.input, "attention_mask")
        mask.type.tensor_type.elem_type = TensorProto.INT32
        cast_out = "/model/attn_mask_reformat/attention_mask/Cast/output_0"
        rename_values(out, {"attention_mask": cast_out})
        mask.name = "attention_mask"
        _prepend(g, [helper.make_node("Cast", ["attention_mask"], [cast_out],
                                      name="/model/attn_mask_reformat/attention_mask/Cast",
                                      to=TensorProto.INT64)])
    drop_config(out)
    return out


def fused_gqa_without_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """A genai-flavour model in the layout of transformers' export after onnxruntime's
    CPU fusions: GroupQueryAttention, no attention_mask input (the graph makes its mask
    of ones from the past's length and the new tokens), and each present declared as
    `past_sequence_length + sequence_length`, a buffer of its own. Its past can be a
    view of the filled rows of a fixed buffer, never the whole buffer."""
    cfg = config_of(model)
    if cfg.flavor != "genai":
        raise ModelBuildError(f"fused_gqa_without_mask: needs a flavor='genai' model, got flavor={cfg.flavor!r}")
    out = copy.deepcopy(model)
    g = out.graph
    kv = _kv_names(cfg)
    _remove_inputs(g, {"attention_mask"})
    _prepend(g, _ones_mask("attention_mask", [(kv[0][2], 2), ("input_ids", 1)], "/model/ones_mask"))
    for _, _, _, present in kv:
        _set_dims(_by_name(g.output, present), [BATCH, cfg.kv_heads, f"{PAST} + {SEQ}", cfg.head_dim])
    drop_config(out)
    return out


# -- optimum merged decoder -------------------------------------------------------------------
def optimum_merged(model: onnx.ModelProto, *, constants: str = "branch") -> onnx.ModelProto:
    """optimum's `decoder_model_merged.onnx`: `If(use_cache_branch)` whose then-branch is
    the with-past decoder and whose else-branch is the first-run decoder (the past
    inputs unread); weights stay in the outer graph, shared by both branches.

    `constants="branch"`: small constants (the exporters' `/model/constants/...`) are
    `Constant` nodes inside each branch, as TorchScript exports them; "outer": they
    stay outer-graph initializers the branches read from the enclosing scope.
    """
    if constants not in ("branch", "outer"):
        raise ModelBuildError(f"optimum_merged: constants must be 'branch' or 'outer', got {constants!r}")
    cfg = config_of(model)
    src = model.graph
    pasts = {past for _, _, past, _ in _kv_names(cfg)}
    outputs = [o.name for o in src.output]
    small = [t for t in src.initializer if constants == "branch" and t.name.startswith("/model/constants/")]
    weights = [t for t in src.initializer if t not in small]

    def branch(name: str, suffix: str, first_run: bool) -> onnx.GraphProto:
        g = onnx.GraphProto(name=name)
        g.node.extend(helper.make_node("Constant", [], [t.name], name=f"{t.name}/Constant{suffix}", value=t)
                      for t in small)
        g.node.extend(copy.deepcopy(list(src.node)))
        if first_run:
            _past_concats_to_identity(g, pasts)
        mapping = {o: f"{o}{suffix}" for o in outputs}
        for node in g.node:
            node.input[:] = [mapping.get(n, n) for n in node.input]
            node.output[:] = [mapping.get(n, n) for n in node.output]
            node.name = f"{node.name}{suffix}"
        for o in src.output:
            g.output.append(helper.make_tensor_value_info(mapping[o.name], o.type.tensor_type.elem_type, None))
        return g

    if_node = helper.make_node(
        "If", ["use_cache_branch"], outputs, name="optimum::if",
        then_branch=branch("with_past", "_with_past", False),
        else_branch=branch("no_past", "_no_past", True),
    )
    graph = helper.make_graph([if_node], src.name, list(src.input), list(src.output), weights)
    graph.input.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                             producer_name="optimum-onnx")


# -- transformers' ONNX exporter (prefill + decode graphs) -------------------------------------
def _ones_mask(name: str, sources: list[tuple[str, int]], prefix: str) -> list[onnx.NodeProto]:
    """int64 ones `[batch, sum of dims]` named `name`; `sources` = (value, axis) whose
    dims add up to the mask length (the exporter's graphs have no attention_mask)."""
    nodes, parts = [], []
    for j, (value, axis) in enumerate(sources):
        out = f"{prefix}/Shape_{j}/output_0"
        nodes.append(helper.make_node("Shape", [value], [out], name=f"{prefix}/Shape_{j}", start=axis, end=axis + 1))
        parts.append(out)
    total = parts[0]
    for j, p in enumerate(parts[1:]):
        nxt = f"{prefix}/Add_{j}/output_0"
        nodes.append(helper.make_node("Add", [total, p], [nxt], name=f"{prefix}/Add_{j}"))
        total = nxt
    batch = f"{prefix}/Shape_batch/output_0"
    nodes.append(helper.make_node("Shape", [sources[-1][0]], [batch], name=f"{prefix}/Shape_batch", start=0, end=1))
    shape = f"{prefix}/Concat/output_0"
    nodes.append(helper.make_node("Concat", [batch, total], [shape], name=f"{prefix}/Concat", axis=0))
    nodes.append(helper.make_node("ConstantOfShape", [shape], [name], name=f"{prefix}/ConstantOfShape",
                                  value=numpy_helper.from_array(np.ones(1, np.int64))))
    return nodes


#: the exporter's symbolic dims (torch.export names them s<N>)
TF_BATCH, TF_SEQ, TF_PAST = "s0", "s70", "s53"


def transformers_graphs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(prefill, decode) in transformers' exporter interface, from a flavor='onnx' llama."""
    cfg = config_of(model)
    if cfg.flavor != "onnx" or not cfg.uses_position_ids:
        raise ModelBuildError("transformers_graphs: needs a flavor='onnx' model with position_ids")
    kv = _kv_names(cfg)
    kvh, hd = str(cfg.kv_heads), str(cfg.head_dim)
    names = {"key": "keys", "value": "values"}

    decode = copy.deepcopy(model)
    g = decode.graph
    _remove_inputs(g, {"attention_mask"})
    _prepend(g, _ones_mask("attention_mask", [(kv[0][2], 2), ("input_ids", 1)], "/model/ones_mask"))
    mapping = {}
    for layer, kind, past, present in kv:
        mapping[past] = f"input.cache.layers.{layer}.{names[kind]}"
        mapping[present] = f"output.cache.layers.{layer}.{names[kind]}"
    rename_values(decode, mapping)
    for layer, kind, _, _ in kv:
        _set_dims(_by_name(g.input, f"input.cache.layers.{layer}.{names[kind]}"), [TF_BATCH, kvh, TF_PAST, hd])
        _set_dims(_by_name(g.output, f"output.cache.layers.{layer}.{names[kind]}"),
                  [TF_BATCH, kvh, f"{TF_PAST} + {TF_SEQ}", hd])

    prefill = copy.deepcopy(model)
    g2 = prefill.graph
    pasts = {past for _, _, past, _ in kv}
    _remove_inputs(g2, pasts | {"attention_mask"})
    _past_concats_to_identity(g2, pasts)
    _prepend(g2, _ones_mask("attention_mask", [("input_ids", 1)], "/model/ones_mask"))
    rename_values(prefill, {present: f"cache.layers.{layer}.{names[kind]}" for layer, kind, _, present in kv})
    for layer, kind, _, _ in kv:
        _set_dims(_by_name(g2.output, f"cache.layers.{layer}.{names[kind]}"), [TF_BATCH, kvh, TF_SEQ, hd])

    for m in (prefill, decode):
        for name in ("input_ids", "position_ids"):
            _set_dims(_by_name(m.graph.input, name), [TF_BATCH, TF_SEQ])
        _set_dims(_by_name(m.graph.output, "logits"), [TF_BATCH, TF_SEQ, cfg.vocab])
        drop_config(m)
        m.producer_name = "pytorch"
    return prefill, decode


def hf_config(cfg: ModelConfig) -> dict:
    """A transformers `config.json` for a built-in Llama."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab, "max_position_embeddings": cfg.max_positions,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }


def transformers_export(directory: str | Path, size: str = "tiny", seed: int = 0,
                        build: Callable[..., onnx.ModelProto] | None = None, **overrides) -> Path:
    """Write a tiny Llama as transformers' ONNX exporter lays it out; returns the folder."""
    from .llama import llama  # noqa: PLC0415 - llama imports nothing from here

    model = (build or llama)(size, flavor="onnx", seed=seed, **overrides)
    cfg = config_of(model)
    prefill, decode = transformers_graphs(model)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(prefill, out / "prefill.onnx")
    onnx.save(decode, out / "decode.onnx")
    (out / "config.json").write_text(json.dumps(hf_config(cfg), indent=2))
    (out / "export.json").write_text(json.dumps(
        {"export_format": "onnx", "exporter": "dynamo", "graphs": {"prefill": "prefill.onnx",
                                                                    "decode": "decode.onnx"}}, indent=2))
    return out


def tied_embeddings(model: onnx.ModelProto) -> onnx.ModelProto:
    """The embedding table read as `Transpose(lm_head weight)`, as onnxruntime-genai's
    builder writes tied embeddings: the separate table goes, the Gather reads the
    transposed projection (float lm_head only)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    gather = next(n for n in graph.node if n.op_type == "Gather" and n.input[0] in inits)
    head = next(n for n in graph.node if n.op_type == "MatMul" and n.name.startswith("/lm_head"))
    weight = head.input[1]
    table = inits[gather.input[0]]
    if list(inits[weight].dims) != list(reversed(table.dims)):
        raise ValueError(f"lm_head weight {weight!r} {list(inits[weight].dims)} is not the transposed "
                         f"embedding table {list(table.dims)}")
    inits[weight].CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(
        onnx.numpy_helper.to_array(table).T), weight))  # the tie: one matrix serves both
    graph.initializer.remove(table)
    transposed = f"{weight}/Transpose/output_0"
    gather.input[0] = transposed
    _prepend(graph, [onnx.helper.make_node("Transpose", [weight], [transposed], perm=[1, 0],
                                           name="/model/embed_tokens/tied/Transpose")])
    return out


def save_tied_embeddings(model_path: str | Path, folder: str | Path) -> Path:
    """`tied_embeddings` of the model file at `model_path` (its external data read too),
    written to `folder/model.onnx` with the weights beside it as `model.onnx.data`:
    SmolLM2's conversion as onnxruntime-genai's builder lays out its tied embeddings."""
    out = Path(folder) / "model.onnx"
    onnx.save_model(tied_embeddings(onnx.load(str(model_path))), str(out), save_as_external_data=True,
                    location=out.name + ".data")
    return out


__all__ = ["GENAI_HEAD_DIM", "drop_config", "genai_builder", "hf_config", "optimum_merged", "rename_values",
           "save_tied_embeddings", "tied_embeddings", "transformers_export", "transformers_graphs"]


"""What a built-in decoder is: its hyper-parameters, stored inside the model.

Every builder writes its `ModelConfig` as JSON into `model.metadata_props` under
`CONFIG_KEY`, so a Generator learns layer count, KV heads, head size and EOS from
the model alone (`config_of`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import onnx

from workbench.errors import WorkbenchError

CONFIG_KEY = "workbench.model_config"

#: Symbolic dimension names shared by every builder (and by real exporters).
BATCH = "batch_size"
SEQ = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "total_sequence_length"


class ModelBuildError(WorkbenchError, ValueError):
    """A builder was asked for a size, flavour or option it does not have."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of one built-in decoder."""

    family: str  # "gpt2" | "llama" | "phi3"
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_positions: int
    eos_token_id: int
    bos_token_id: int = 0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # unused by gpt2 (learned positions)
    #: phi3 LongRoPE: the If picks the long caches once total length exceeds this
    original_max_positions: int = 0
    flavor: str = "onnx"  # "onnx" (standard ops) | "genai" (com.microsoft fused ops)
    quant: str | None = None  # None | "int4"
    size: str = ""
    seed: int = 0

    # -- naming of the decode interface -------------------------------------------
    @property
    def uses_position_ids(self) -> bool:
        """genai-style models derive positions from `attention_mask` instead."""
        return self.flavor != "genai"

    @staticmethod
    def past_names(layer: int) -> tuple[str, str]:
        return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"

    @staticmethod
    def present_names(layer: int) -> tuple[str, str]:
        return f"present.{layer}.key", f"present.{layer}.value"

    def kv_shape(self, batch: int, length: int) -> tuple[int, int, int, int]:
        """Shape of one past/present tensor: [batch, kv_heads, length, head_dim]."""
        return (batch, self.kv_heads, length, self.head_dim)

    def empty_past(self, batch: int = 1, length: int = 0) -> dict[str, np.ndarray]:
        """Zero-filled past feeds (length 0 for a first prefill)."""
        feeds = {}
        for i in range(self.num_layers):
            for name in self.past_names(i):
                feeds[name] = np.zeros(self.kv_shape(batch, length), np.float32)
        return feeds

    # -- (de)serialisation -------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def resolve_config(family: str, sizes: dict[str, ModelConfig], size: str, overrides: dict) -> ModelConfig:
    """Pick `size` from a family's table and apply keyword overrides."""
    if size not in sizes:
        raise ModelBuildError(f"{family}: unknown size {size!r}; expected one of {sorted(sizes)}")
    cfg = dataclasses.replace(sizes[size], size=size)
    if overrides:
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ModelBuildError(f"{family}: unknown config override(s) {bad}")
        cfg = dataclasses.replace(cfg, **overrides)
    if cfg.heads % cfg.kv_heads:
        raise ModelBuildError(
            f"{family}: heads ({cfg.heads}) must be a multiple of kv_heads ({cfg.kv_heads})"
        )
    return cfg


def attach_config(model: onnx.ModelProto, cfg: ModelConfig) -> onnx.ModelProto:
    """Store `cfg` as JSON in the model's metadata (replacing any earlier one)."""
    for i in reversed(range(len(model.metadata_props))):
        if model.metadata_props[i].key == CONFIG_KEY:
            del model.metadata_props[i]
    entry = model.metadata_props.add()
    entry.key = CONFIG_KEY
    entry.value = cfg.to_json()
    return model


def config_of(model: onnx.ModelProto) -> ModelConfig:
    """The `ModelConfig` a built-in builder stored in `model`."""
    for prop in model.metadata_props:
        if prop.key == CONFIG_KEY:
            return ModelConfig.from_json(prop.value)
    raise ModelBuildError(
        f"model {model.graph.name!r} has no {CONFIG_KEY!r} metadata; "
        "it was not made by a workbench.models builder"
    )


def count_parameters(model: onnx.ModelProto) -> int:
    """Elements of the float weight initializers (rotary caches excluded)."""
    total = 0
    for init in model.graph.initializer:
        if init.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        if "cos_cache" in init.name or "sin_cache" in init.name:
            continue
        total += int(np.prod(init.dims, dtype=np.int64)) if init.dims else 1
    return total

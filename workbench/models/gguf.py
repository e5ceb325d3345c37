"""GGUF (llama.cpp) files -> genai-flavour ONNX decoders, with numpy only (no torch).

    model = from_gguf("model.gguf")                 # onnx.ModelProto, fp32 weights
    path = convert_gguf("model.gguf")               # converted once, cached, -> model.onnx path
    tok = GGUFTokenizer.from_gguf("model.gguf")     # see tokenizer.py

`read_gguf` parses the file with `gguf.GGUFReader` and dequantizes every tensor
type `gguf.quants.dequantize` knows (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, the K-quants, ...). llama.cpp's converter permutes the rows of the Q and K
projections so that its rotary pairs are interleaved (row 2i / 2i+1 of a head
hold torch rows i / i + D/2); `from_gguf` undoes that and builds the same graph
as `llama(flavor="genai")` (GroupQueryAttention with do_rotary=1,
SkipSimplifiedLayerNormalization, SwiGLU), tying the LM head to the embedding when
the file has no `output.weight`.

Anything the converter cannot represent faithfully (another architecture, MoE,
biases, a rope scaling it does not implement, a tensor type without a
dequantizer, a truncated or corrupt file) raises `ModelLoadError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from workbench.errors import ModelLoadError

from .config import ModelBuildError, ModelConfig
from .llama import DecoderWeights, LayerWeights, llama_genai_from_weights

#: architectures whose GGUF tensors map onto the genai Llama graph
SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_DTYPES = ("float32",)
#: bump when the graph `from_gguf` emits changes, so cached conversions are redone
CONVERTER_VERSION = 1
SOURCE_KEY = "workbench.gguf_source"
#: initializers at least this large go to the external data file when saving
EXTERNAL_DATA_THRESHOLD = 1024
#: a model whose weights exceed this many bytes is saved with external data
EXTERNAL_DATA_MIN_MODEL_BYTES = 256 * 1024 * 1024

_MISSING = object()


def _require_gguf():
    try:
        import gguf  # noqa: PLC0415
    except ImportError:
        raise ModelLoadError(
            "reading GGUF files needs the 'gguf' package (pip install gguf)"
        ) from None
    return gguf


def _decode_part(part: np.ndarray, vtype, gguf) -> Any:
    if vtype == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    if vtype == gguf.GGUFValueType.BOOL:
        return bool(part[0])
    value = part[0]
    return value.item() if hasattr(value, "item") else value


def _field_value(field, gguf) -> Any:
    """The Python value of one metadata field (scalar, string, or list of those)."""
    types = list(field.types)
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) < 2:
            return []
        if types[1] == gguf.GGUFValueType.ARRAY:
            raise ModelLoadError(f"GGUF metadata {field.name!r}: nested arrays are not supported")
        return [_decode_part(field.parts[i], types[1], gguf) for i in field.data]
    return _decode_part(field.parts[field.data[0]], types[0], gguf)


@dataclass
class GGUFTensorInfo:
    name: str
    type_name: str  # "Q4_1", "F32", ...
    shape: tuple[int, ...]  # numpy order (llama.cpp's ne reversed): [rows, cols]


class GGUFFile:
    """A parsed GGUF file: metadata on demand, tensors dequantized to float32 on demand."""

    def __init__(self, path: str | os.PathLike):
        gguf = _require_gguf()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"GGUF file {str(self.path)!r} does not exist")
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # a truncated or corrupt header fails anywhere inside the reader
            raise ModelLoadError(
                f"{str(self.path)!r} is not a readable GGUF file (corrupt or truncated): "
                f"{type(e).__name__}: {e}"
            ) from None
        self._gguf = gguf
        self._fields = self._reader.fields
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._check_tensor_bytes()

    # -- metadata ---------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._fields)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        field = self._fields.get(key)
        if field is None:
            if default is _MISSING:
                raise ModelLoadError(f"GGUF file {self.path.name!r} has no metadata key {key!r}")
            return default
        try:
            return _field_value(field, self._gguf)
        except (IndexError, ValueError) as e:
            raise ModelLoadError(f"GGUF metadata {key!r} in {self.path.name!r} is corrupt: {e}") from None

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture"))

    # -- tensors ----------------------------------------------------------------
    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def info(self, name: str) -> GGUFTensorInfo:
        t = self._tensors[name]
        shape = tuple(int(d) for d in reversed(list(t.shape)))
        return GGUFTensorInfo(name, t.tensor_type.name, shape)

    def has(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy order (for a weight matrix: [out, in])."""
        t = self._tensors.get(name)
        if t is None:
            raise ModelLoadError(f"GGUF file {self.path.name!r} has no tensor {name!r}")
        info = self.info(name)
        try:
            values = self._gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        except NotImplementedError:
            raise ModelLoadError(
                f"GGUF tensor {name!r} has type {info.type_name}, which this converter cannot "
                "dequantize (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, K-quants "
                "and the other types gguf.quants implements)"
            ) from None
        except Exception as e:
            raise ModelLoadError(
                f"GGUF tensor {name!r} ({info.type_name}) cannot be dequantized: {type(e).__name__}: {e}"
            ) from None
        values = np.asarray(values, dtype=np.float32)
        if values.size != int(np.prod(info.shape, dtype=np.int64)):
            raise ModelLoadError(
                f"GGUF tensor {name!r}: {values.size} values after dequantizing, shape says {info.shape}"
            )
        return values.reshape(info.shape)

    def _check_tensor_bytes(self) -> None:
        """Every tensor's bytes lie inside the file (a truncated download fails here)."""
        sizes = self._gguf.GGML_QUANT_SIZES
        file_size = self.path.stat().st_size
        for t in self._reader.tensors:
            block, type_size = sizes.get(t.tensor_type, (None, None))
            if block is None:
                continue
            n = int(np.prod([int(d) for d in t.shape], dtype=np.int64))
            need = n // block * type_size
            end = int(t.data_offset) + need  # data_offset is absolute
            if end > file_size or np.asarray(t.data).nbytes < need:
                raise ModelLoadError(
                    f"GGUF file {self.path.name!r} is truncated: tensor {t.name!r} needs bytes up to "
                    f"{end}, the file has {file_size}"
                )


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF file (raises ModelLoadError when it is missing, corrupt or truncated)."""
    return GGUFFile(path)


# -- hyper-parameters -------------------------------------------------------------
def gguf_config(f: GGUFFile, *, max_positions: int | None = None) -> tuple[ModelConfig, np.ndarray | None]:
    """(ModelConfig, rope frequency factors or None) from the file's metadata."""
    arch = f.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )

    def key(name: str, default: Any = _MISSING) -> Any:
        return f.get(f"{arch}.{name}", default)

    experts = int(key("expert_count", 0) or 0)
    if experts > 0:
        raise ModelLoadError(f"GGUF {arch} model with {experts} experts (mixture of experts) is not supported")
    layers = int(key("block_count"))
    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise ModelLoadError(f"GGUF {arch}: head_count {heads} is not a multiple of head_count_kv {kv_heads}")
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise ModelLoadError(f"GGUF {arch}: attention.value_length != key_length is not supported")
    rot = int(key("rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ModelLoadError(
            f"GGUF {arch}: partial rotary (rope.dimension_count {rot} < head dim {head_dim}) is not supported"
        )
    if head_dim % 16:
        raise ModelLoadError(
            f"GGUF {arch}: head dim {head_dim} is not a multiple of 16 (GroupQueryAttention do_rotary needs it)"
        )
    embed = f.info("token_embd.weight") if f.has("token_embd.weight") else None
    if embed is None:
        raise ModelLoadError(f"GGUF file {f.path.name!r} has no tensor 'token_embd.weight'")
    vocab = embed.shape[0]
    context = int(key("context_length", 4096))
    positions = min(context, max_positions) if max_positions else context

    factors = None
    scaling = str(key("rope.scaling.type", "none") or "none")
    if scaling == "linear":
        factor = float(key("rope.scaling.factor", 1.0) or 1.0)
        factors = np.full(head_dim // 2, factor, np.float64)
    elif scaling != "none":
        raise ModelLoadError(f"GGUF {arch}: rope scaling {scaling!r} is not supported (supported: none, linear)")
    if f.has("rope_freqs.weight"):
        freqs = f.tensor("rope_freqs.weight").astype(np.float64).reshape(-1)
        if freqs.shape != (head_dim // 2,):
            raise ModelLoadError(f"GGUF {arch}: rope_freqs.weight has {freqs.size} values, expected {head_dim // 2}")
        factors = freqs if factors is None else factors * freqs

    eos = f.get("tokenizer.ggml.eos_token_id", -1)
    bos = f.get("tokenizer.ggml.bos_token_id", -1)
    cfg = ModelConfig(
        family="llama",
        num_layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=int(key("feed_forward_length")),
        vocab=vocab,
        max_positions=positions,
        eos_token_id=int(eos),
        bos_token_id=int(bos),
        norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        flavor="genai",
        quant=None,
        size="gguf",
    )
    return cfg, factors


# -- weights ----------------------------------------------------------------------
def unpermute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation on an [heads * D, in] weight.

    llama.cpp stores head h's torch rows (r_0..r_{D/2-1}, r_{D/2}..r_{D-1}) interleaved
    as (r_0, r_{D/2}, r_1, r_{D/2+1}, ...) for its pairwise rotary; the genai graph
    rotates halves (rotary_interleaved=0), so the torch order is restored.
    """
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


_LAYER_TENSORS = (
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
)
_TOP_TENSORS = ("token_embd", "output_norm", "output", "rope_freqs")


def _check_tensor_names(f: GGUFFile, layers: int) -> None:
    known = {f"{n}.weight" for n in _TOP_TENSORS}
    known |= {f"blk.{i}.{n}.weight" for i in range(layers) for n in _LAYER_TENSORS}
    unknown = [n for n in f.tensor_names if n not in known]
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ModelLoadError(
            f"GGUF file {f.path.name!r} has tensors this llama converter does not support: {shown}"
        )


def _linear(f: GGUFFile, name: str, out_in: tuple[int, int], heads: int | None = None) -> np.ndarray:
    """A linear weight as [K, N] float32, Q/K rows un-permuted when `heads` is given."""
    w = f.tensor(name)
    if w.shape != out_in:
        raise ModelLoadError(f"GGUF tensor {name!r} has shape {w.shape}, expected {out_in}")
    if heads is not None:
        w = unpermute_qk(w, heads)
    return np.ascontiguousarray(w.T)


def _vector(f: GGUFFile, name: str, n: int) -> np.ndarray:
    v = f.tensor(name).reshape(-1)
    if v.shape != (n,):
        raise ModelLoadError(f"GGUF tensor {name!r} has {v.size} values, expected {n}")
    return np.ascontiguousarray(v, dtype=np.float32)


def gguf_weights(f: GGUFFile, cfg: ModelConfig) -> DecoderWeights:
    """The file's weights in the genai builder's layout ([K, N] linears, torch Q/K row order)."""
    _check_tensor_names(f, cfg.num_layers)
    E, F, V = cfg.hidden, cfg.ffn, cfg.vocab
    q_width, kv_width = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    embed = f.tensor("token_embd.weight")
    if embed.shape != (V, E):
        raise ModelLoadError(f"GGUF tensor 'token_embd.weight' has shape {embed.shape}, expected {(V, E)}")
    layers = []
    for i in range(cfg.num_layers):
        p = f"blk.{i}"
        layers.append(
            LayerWeights(
                input_norm=_vector(f, f"{p}.attn_norm.weight", E),
                q=_linear(f, f"{p}.attn_q.weight", (q_width, E), heads=cfg.heads),
                k=_linear(f, f"{p}.attn_k.weight", (kv_width, E), heads=cfg.kv_heads),
                v=_linear(f, f"{p}.attn_v.weight", (kv_width, E)),
                o=_linear(f, f"{p}.attn_output.weight", (E, q_width)),
                post_norm=_vector(f, f"{p}.ffn_norm.weight", E),
                gate=_linear(f, f"{p}.ffn_gate.weight", (F, E)),
                up=_linear(f, f"{p}.ffn_up.weight", (F, E)),
                down=_linear(f, f"{p}.ffn_down.weight", (E, F)),
            )
        )
    if f.has("output.weight"):
        lm_head = _linear(f, "output.weight", (V, E))
    else:  # tied embedding / LM head
        lm_head = np.ascontiguousarray(embed.T)
    final_norm = _vector(f, "output_norm.weight", E)
    return DecoderWeights(np.ascontiguousarray(embed), layers, final_norm, lm_head)


# -- conversion -------------------------------------------------------------------
def from_gguf(
    path: str | os.PathLike, *, dtype: str = "float32", max_positions: int | None = None,
    packed: bool = False,
) -> onnx.ModelProto:
    """A Llama-architecture GGUF as a genai-flavour ONNX decoder (fp32 weights).

    The model has the decode interface of `llama(flavor="genai")` (input_ids,
    attention_mask, past_key_values.{i}.key/value -> logits, present.{i}.key/value)
    and carries its `ModelConfig` (read it with `config_of`), so `workbench.Generator`
    drives it. `max_positions` caps the rotary caches (default: the file's context
    length). `packed=True` multiplies Q/K/V and gate/up as one MatMul each (same
    model, fewer and larger products). Save a large result with `save_model`
    (external data).
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ModelBuildError(f"from_gguf: dtype {dtype!r} is not supported (supported: {SUPPORTED_DTYPES})")
    f = read_gguf(path)
    cfg, factors = gguf_config(f, max_positions=max_positions)
    wts = gguf_weights(f, cfg)
    model = llama_genai_from_weights(cfg, wts, rope_factors=factors, packed=packed)
    del wts
    model.graph.name = str(f.get("general.name", model.graph.name) or model.graph.name)
    entry = model.metadata_props.add()
    entry.key = SOURCE_KEY
    entry.value = json.dumps(
        {"file": f.path.name, "architecture": f.architecture, "name": f.get("general.name", ""),
         "file_type": f.get("general.file_type", None), "converter_version": CONVERTER_VERSION},
        sort_keys=True,
    )
    return model


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool | None = None) -> Path:
    """Write `model` to `path`; large weights go to `<name>.data` next to it (relative location).

    `external_data=None` decides by size (over 256 MiB of initializers, or anything
    protobuf's 2 GiB limit would refuse). Note: saving with external data moves the
    weights out of `model` (it then refers to the file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if external_data is None:
        weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
        external_data = weight_bytes > EXTERNAL_DATA_MIN_MODEL_BYTES
    if external_data:
        location = path.name + ".data"
        data_file = path.parent / location
        if data_file.exists():
            data_file.unlink()  # onnx appends to an existing data file
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=location,
            size_threshold=EXTERNAL_DATA_THRESHOLD,
        )
    else:
        onnx.save_model(model, str(path))
    return path


# -- cached conversion ------------------------------------------------------------
def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $WORKBENCH_CACHE, else ~/.cache/workbench."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("WORKBENCH_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "workbench"


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


STAMP = "workbench-conversion.json"
MODEL_FILE = "model.onnx"


def convert_gguf(
    path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    dtype: str = "float32",
    cache_dir: str | os.PathLike | None = None,
    sha256: str | None = None,
) -> Path:
    """Convert `path` once and return the saved `model.onnx` (reused while valid).

    The conversion lives in `out_dir`, default `<cache>/gguf/<sha256[:16]>-<dtype>/`,
    with a stamp (file hash, converter version, dtype) written last: a stale or
    half-written conversion is redone. `sha256` skips re-hashing a known file.
    """
    path = Path(path)
    digest = sha256 or file_sha256(path)
    if out_dir is None:
        out_dir = cache_root(cache_dir) / "gguf" / f"{digest[:16]}-{dtype}"
    out_dir = Path(out_dir)
    stamp = {"gguf_sha256": digest, "converter_version": CONVERTER_VERSION, "dtype": dtype}
    if _stamp_matches(out_dir, stamp):
        return out_dir / MODEL_FILE
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model = from_gguf(path, dtype=dtype)
        save_model(model, work / MODEL_FILE)
        del model
        (work / STAMP).write_text(json.dumps(stamp, sort_keys=True))
        publish_permissions(work)
        if _stamp_matches(out_dir, stamp):  # another process finished first: keep its files
            return out_dir / MODEL_FILE
        if out_dir.exists():
            shutil.rmtree(out_dir, ignore_errors=True)
        try:
            os.replace(work, out_dir)
        except OSError:
            if not _stamp_matches(out_dir, stamp):  # another process finished first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir / MODEL_FILE


def _umask() -> int:
    try:  # Linux: read it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_permissions(path: str | os.PathLike) -> None:
    """Give `path` (and a folder's files) the permissions the umask allows: temp files
    and folders are created private (0600 / 0700), a cache should not be."""
    path = Path(path)
    mask = _umask()
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in entries:
        try:
            os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~mask)
        except OSError:
            pass


def _stamp_matches(out_dir: Path, stamp: dict) -> bool:
    try:
        found = json.loads((out_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return found == stamp and (out_dir / MODEL_FILE).is_file()


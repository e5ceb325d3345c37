"""Built-in decoder builders: seeded, download-free ONNX models for tests and demos.

    gpt2(size="tiny", seed=0)                         TorchScript-style GPT-2
    llama(size="tiny", flavor="onnx"|"genai", seed=0, quant=None|"int4",
          export=None|"genai-builder"|"optimum-merged"|"torch-dynamo-attention")
    transformers_export(dir)                          prefill.onnx + decode.onnx + config.json
                                                      as transformers' ONNX exporter writes them
    phi3(size="tiny", longrope=True, flavor="genai", seed=0)

Real weights, converted without torch (needs the `gguf` and `tokenizers` packages):

    from_gguf(path, dtype="float32")      a Llama-architecture GGUF -> genai-flavour ModelProto
    convert_gguf(path) -> Path            the same, converted once and cached as model.onnx
    GGUFTokenizer.from_gguf(path)         the file's byte-level BPE tokenizer + chat template
    smollm2(cache_dir=None, gguf_path=None) -> (model path, tokenizer)
                                          SmolLM2-135M-Instruct; raises ModelDownloadError
                                          (`.network`) when it cannot be downloaded

Every model carries its `ModelConfig` in `metadata_props`; read it with `config_of`.
"""

from .config import ModelBuildError, ModelConfig, config_of, count_parameters
from .exports import genai_builder, optimum_merged, transformers_export
from .gguf import GGUFFile, cache_root, convert_gguf, from_gguf, read_gguf, save_model
from .gpt2 import gpt2
from .llama import llama, llama_genai_from_weights
from .phi3 import phi3
from .smollm2 import ModelDownloadError, smollm2
from .tokenizer import GGUFTokenizer, TokenizerError

__all__ = [
    "GGUFFile",
    "GGUFTokenizer",
    "ModelBuildError",
    "ModelConfig",
    "ModelDownloadError",
    "TokenizerError",
    "cache_root",
    "config_of",
    "convert_gguf",
    "count_parameters",
    "from_gguf",
    "genai_builder",
    "gpt2",
    "llama",
    "llama_genai_from_weights",
    "optimum_merged",
    "phi3",
    "read_gguf",
    "save_model",
    "smollm2",
    "transformers_export",
]

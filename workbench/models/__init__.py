"""Built-in decoder builders: seeded, download-free ONNX models for tests and demos.

    gpt2(size="tiny", seed=0)                         TorchScript-style GPT-2
    llama(size="tiny", flavor="onnx"|"genai", seed=0, quant=None|"int4")
    phi3(size="tiny", longrope=True, flavor="genai", seed=0)

Every model carries its `ModelConfig` in `metadata_props`; read it with `config_of`.
"""

from .config import ModelBuildError, ModelConfig, config_of, count_parameters
from .gpt2 import gpt2
from .llama import llama
from .phi3 import phi3

__all__ = [
    "ModelBuildError",
    "ModelConfig",
    "config_of",
    "count_parameters",
    "gpt2",
    "llama",
    "phi3",
]

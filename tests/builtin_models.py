"""The built-in decoders every decode test sweeps, by name (tiny sizes)."""

from workbench import models

BUILT_IN = {
    "gpt2": lambda: models.gpt2("tiny"),
    "llama-onnx": lambda: models.llama("tiny", flavor="onnx"),
    "llama-genai": lambda: models.llama("tiny", flavor="genai"),
    "llama-genai-int4": lambda: models.llama("tiny", flavor="genai", quant="int4"),
    "phi3": lambda: models.phi3("tiny"),
}

#: an 8-token prompt
PROMPT = list(range(3, 11))

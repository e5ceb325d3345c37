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


def move_a_kv_buffer_at(generator, run: int = 8) -> None:
    """An injected fault: at the given run, one KV buffer is replaced by a copy at a new
    address, as a careless caller might (a captured graph must retire, not replay)."""
    original_step = generator._step
    calls = []

    def step(tokens, cache, phase, slot):
        calls.append(1)
        if len(calls) == run:
            name = next(iter(cache.arrays))
            cache.arrays[name] = cache.arrays[name].copy()
        return original_step(tokens, cache, phase, slot)

    generator._step = step

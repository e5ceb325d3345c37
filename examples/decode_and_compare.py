"""Decode with a built-in model on workbench and on onnxruntime, and compare.

python examples/decode_and_compare.py [gpt2|llama|phi3]
"""

import sys

import onnxruntime as ort

import workbench
from workbench import models

family = sys.argv[1] if len(sys.argv) > 1 else "llama"
build = {"gpt2": models.gpt2, "llama": lambda s: models.llama(s, flavor="genai"), "phi3": models.phi3}[family]
data = build("tiny").SerializeToString()

ours = workbench.InferenceSession(data)
print("inputs:", [(i.name, i.shape, i.type) for i in ours.get_inputs()][:3], "...")
print("nodes on the onnx.reference fallback:", ours.fallback_nodes() or "none")

prompt = [5, 17, 42, 99, 7, 3, 11, 64]
mine = workbench.Generator(ours).generate(prompt, 24, progress=False)
peer = workbench.Generator(ort.InferenceSession(data, providers=["CPUExecutionProvider"])).generate(
    prompt, 24, progress=False)
print("workbench  :", mine.tokens)
print("onnxruntime:", peer.tokens)
print("identical:", mine.tokens == peer.tokens, f"| KV cache: {mine.kv_mode}, shared buffer: {mine.shared_buffer}")

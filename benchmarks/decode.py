"""Per-token decode latency: workbench vs onnxruntime, same model file, same loop, same run.

Usage: python benchmarks/decode.py [--size small] [--tokens 32] [--model PATH] [--no-smollm2]

One row per export idiom the project's builders make (workbench's own llama in both
op flavours, onnxruntime-genai's builder layout with and without tied embeddings and
int4 weights, optimum's merged decoder, torch dynamo's opset-23 Attention), SmolLM2,
and any `--model`. The tied-embeddings row also runs with the load-time optimizer off,
to show what constant folding of `Transpose(lm_head)` is worth.
"""

from __future__ import annotations

import argparse

import onnxruntime as ort

import workbench
from workbench import Generator, SessionOptions, WorkbenchError, models
from workbench.models import exports

PROMPT = list(range(3, 19))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="small")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--no-smollm2", action="store_true", help="skip the real model (needs a download once)")
    parser.add_argument("--model", action="append", default=[], help="an exported decoder (.onnx) to add")
    args = parser.parse_args()
    print(f"greedy decode of {args.tokens} tokens after a {len(PROMPT)}-token prompt; built-ins at size {args.size}")
    print(f"{'model':<22}{'kv':<9}{'workbench ms/tok':>18}{'onnxruntime ms/tok':>20}{'ratio':>8}{'tokens':>10}")
    for label, data, level in _models(args):
        ours = workbench.InferenceSession(data, SessionOptions(graph_optimization_level=level))
        peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        a = Generator(ours).generate(PROMPT, args.tokens, progress=False, eos_token_id=-1)
        b = Generator(peer).generate(PROMPT, args.tokens, progress=False, eos_token_id=-1)
        same = "same" if a.tokens == b.tokens else "DIFFER"
        print(f"{label:<22}{a.kv_mode:<9}{a.decode_latency * 1e3:>18.2f}{b.decode_latency * 1e3:>20.2f}"
              f"{a.decode_latency / b.decode_latency:>8.2f}{same:>10}")


def _models(args):
    size = args.size
    yield "llama (onnx ops)", models.llama(size, flavor="onnx").SerializeToString(), "all"
    yield "llama (genai ops)", models.llama(size, flavor="genai").SerializeToString(), "all"
    yield "genai builder", models.llama(size, flavor="genai", export="genai-builder").SerializeToString(), "all"
    tied = exports.tied_embeddings(models.llama(size, flavor="genai")).SerializeToString()
    yield "genai tied emb.", tied, "all"
    yield "genai tied, no fold", tied, "disabled"
    yield "genai int4", models.llama(size, flavor="genai", quant="int4").SerializeToString(), "all"
    yield "optimum merged", models.llama(size, flavor="onnx", export="optimum-merged").SerializeToString(), "all"
    yield "torch opset-23 Attn", models.llama(size, flavor="onnx", export="torch-dynamo-attention"
                                              ).SerializeToString(), "all"
    for path in args.model:
        yield path[-22:], path, "all"
    if args.no_smollm2:
        return
    try:
        path, _ = models.smollm2()
    except WorkbenchError as e:
        print(f"(SmolLM2 skipped: {e})")
        return
    yield "SmolLM2-135M fp32", str(path), "all"


if __name__ == "__main__":
    main()

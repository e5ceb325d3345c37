"""`workbench demo`: chat with SmolLM2-135M-Instruct (or a built-in model), recording
everything; write `workbench-report/` and print the summary."""

from __future__ import annotations

import argparse

from ..reports.latency import LATENCY_DEFINITION as _DEFINITION
from .report import decode_and_report, stream_printer

DEMO_QUESTION = "Explain in a few sentences why the sky is blue."
FALLBACK_PROMPT = [1, 415, 2936, 868, 285, 1142, 461, 754, 272, 1514, 3914, 4147]


#: how the demo's latency is defined, for both runtimes alike (`reports.latency`: one definition)
LATENCY_DEFINITION = ("latency: " + _DEFINITION + ", the decode graph's runs timed alike for workbench and "
                      "onnxruntime (the same Generator loop drives both); the summary prints the same number")


def run_demo(args: argparse.Namespace) -> int:
    from .. import models  # noqa: PLC0415
    from ..errors import ModelLoadError  # noqa: PLC0415

    if not args.builtin:
        try:
            path, tokenizer = models.smollm2(gguf_path=args.gguf)
        except ModelLoadError as e:
            print(f"SmolLM2 could not be obtained ({e}); using the built-in small llama instead.")
        else:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": DEMO_QUESTION}])
            print(f"model: SmolLM2-135M-Instruct (converted from GGUF: {path})")
            print("graph: the GGUF's weights written as a llama decoder in onnxruntime-genai's dialect "
                  "(GroupQueryAttention with a fixed, shared KV buffer), as onnxruntime-genai would run it")
            print(LATENCY_DEFINITION)
            print(f"user: {DEMO_QUESTION}")
            return decode_and_report(path, prompt, args.tokens, out_dir=args.out,
                                     eos_token_id=tokenizer.eos_token_id,
                                     on_token=stream_printer(tokenizer, args.tokens),
                                     label="SmolLM2-135M-Instruct")
    model = models.llama("small", flavor="onnx", seed=0)
    cfg = models.config_of(model)
    print(f"model: built-in llama (small, random weights: {cfg.num_layers} layers, {cfg.hidden} wide, "
          f"{cfg.heads} heads / {cfg.kv_heads} KV heads); its tokens are ids, not text")
    print("graph: the standard-ops ('onnx') flavour, attention spelled out as MatMul / Reshape / Transpose / "
          "Expand / Concat / Softmax: so the report has content in every panel -- zero-copy views "
          "(Reshape, Transpose), in-place writes, captured segments and eager seams with their reasons "
          "(host_read, growing_symbol), a KV cache that grows by a copy every step")
    prompt = [t % cfg.vocab for t in FALLBACK_PROMPT]
    print(LATENCY_DEFINITION)
    return decode_and_report(model, prompt, args.tokens, out_dir=args.out, eos_token_id=-1,
                             label="built-in llama (small)")


def add_parser(sub) -> None:
    demo = sub.add_parser("demo", help="chat with SmolLM2 (or the built-in small llama); write workbench-report/")
    demo.add_argument("--tokens", type=int, default=64)
    demo.add_argument("--out", default="workbench-report")
    demo.add_argument("--builtin", action="store_true", help="skip SmolLM2; use the built-in small llama")
    demo.add_argument("--gguf", default=None, help="a SmolLM2-135M-Instruct Q4_1 GGUF you already have")
    demo.set_defaults(func=run_demo)

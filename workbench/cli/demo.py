"""`workbench demo`: decode with the built-in small llama and compare with onnxruntime."""

from __future__ import annotations

import argparse
import time

DEMO_PROMPT = [1, 415, 2936, 9060, 285, 1142, 461, 754, 272, 17898, 3914, 28723]


def run_demo(args: argparse.Namespace) -> int:
    from .. import Generator, InferenceSession, models  # noqa: PLC0415

    t0 = time.perf_counter()
    model = models.llama(args.size, flavor="genai", seed=0)
    data = model.SerializeToString()
    built = time.perf_counter() - t0
    cfg = models.config_of(model)
    print(f"model: built-in llama ({args.size}, genai flavour): {models.count_parameters(model) / 1e6:.1f} M "
          f"parameters, {cfg.num_layers} layers, built in {built:.1f} s")
    session = InferenceSession(data)
    prompt = [t % cfg.vocab for t in DEMO_PROMPT]
    result = Generator(session).generate(prompt, args.tokens, progress=True, eos_token_id=-1)
    rows = [("workbench", result)]
    try:
        import onnxruntime as ort  # noqa: PLC0415

        peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        peer_result = Generator(peer).generate(prompt, args.tokens, progress=False, eos_token_id=-1)
        rows.append(("onnxruntime", peer_result))
    except ImportError:
        peer_result = None
    print(f"prompt ({len(prompt)} tokens): {prompt}")
    print(f"generated {len(result.tokens)} tokens (KV cache: {result.kv_mode}"
          f"{', shared past/present buffer' if result.shared_buffer else ''}): {result.tokens}")
    print(f"\n{'runtime':<14}{'prefill ms':>12}{'ms/token':>10}{'tokens/s':>10}")
    for name, r in rows:
        per_token = r.decode_latency
        print(f"{name:<14}{r.step_times[0] * 1e3:>12.1f}{per_token * 1e3:>10.2f}{1 / per_token:>10.1f}")
    if peer_result is not None:
        ratio = result.decode_latency / peer_result.decode_latency
        same = "identical" if peer_result.tokens == result.tokens else "DIFFERENT"
        print(f"\nworkbench per-token latency is {ratio:.2f}x onnxruntime's; tokens are {same}")
    else:
        print("\n(onnxruntime is not installed: no comparison)")
    return 0 if peer_result is None or peer_result.tokens == result.tokens else 1


def add_parser(sub) -> None:
    demo = sub.add_parser("demo", help="decode 64 tokens with the built-in small llama; compare with onnxruntime")
    demo.add_argument("--size", default="small", choices=["tiny", "small"])
    demo.add_argument("--tokens", type=int, default=64)
    demo.set_defaults(func=run_demo)


__all__ = ["add_parser", "run_demo"]

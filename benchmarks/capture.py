"""Per-token decode latency with captured-segment replay vs eager, same run.

CPU backend always; the CUDA backend too when CuPy finds a GPU.
Usage: python benchmarks/capture.py [--size small] [--tokens 48]
"""

from __future__ import annotations

import argparse

import workbench
from workbench import Generator, SessionOptions, models

PROMPT = list(range(3, 19))


def decode(data: bytes, backend: str, capture: bool, tokens: int):
    options = SessionOptions(capture=capture, decode_memo_verify=False)
    session = workbench.InferenceSession(data, options=options, backend=backend)
    result = Generator(session).generate(PROMPT, tokens, kv="fixed", progress=False, eos_token_id=-1)
    replayed = (session.recording.node_timings()["mode"] == "replayed").mean() if capture else 0.0
    return result, replayed


def backends() -> list[str]:
    names = ["cpu"]
    try:
        import cupy

        if cupy.cuda.is_available():
            names.append("cuda")
    except Exception:  # noqa: BLE001 - no CuPy, or no usable GPU
        pass
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="small")
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    data = models.llama(args.size, flavor="genai").SerializeToString()
    print(f"llama {args.size} (genai), fixed KV, {args.tokens} tokens; per-token latency (median)")
    print(f"{'backend':<9}{'eager ms':>10}{'replay ms':>11}{'speedup':>9}{'nodes replayed':>16}{'tokens':>8}")
    for backend in backends():
        eager, _ = decode(data, backend, False, args.tokens)
        replay, share = decode(data, backend, True, args.tokens)
        same = "same" if eager.tokens == replay.tokens else "DIFFER"
        print(f"{backend:<9}{eager.decode_latency * 1e3:>10.2f}{replay.decode_latency * 1e3:>11.2f}"
              f"{eager.decode_latency / replay.decode_latency:>8.2f}x{share:>15.0%}{same:>8}")


if __name__ == "__main__":
    main()

"""Decode-plan memo: shape-resolution time per step and per-token latency, memo on vs off.

Small built-in llama (both flavours), same machine, same run.
Usage: python benchmarks/memo.py [--tokens 48]
"""

from __future__ import annotations

import argparse

import workbench
from workbench import Generator, SessionOptions, models

PROMPT = list(range(3, 19))


def decode(data: bytes, memo: bool, tokens: int):
    session = workbench.InferenceSession(data, options=SessionOptions(decode_memo=memo, decode_memo_verify=False))
    result = Generator(session).generate(PROMPT, tokens, progress=False, eos_token_id=-1)
    timeline = session.recording.memo_timeline()
    steady = timeline.iloc[3:]  # decode steps after prime, prime, rebuild
    return result, steady.resolve_ms.median(), timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    print(f"{args.tokens}-token greedy decode, steady decode steps (median)")
    print(f"{'model':<20}{'resolve off ms':>15}{'resolve on ms':>14}{'cheaper':>9}"
          f"{'ms/tok off':>12}{'ms/tok on':>11}{'speedup':>9}{'elided/step':>12}")
    for label, flavor in (("llama small (onnx)", "onnx"), ("llama small (genai)", "genai")):
        data = models.llama("small", flavor=flavor).SerializeToString()
        off, res_off, _ = decode(data, False, args.tokens)
        on, res_on, timeline = decode(data, True, args.tokens)
        assert on.tokens == off.tokens, "memo changed the tokens"
        elided = timeline.dispatch_elided.iloc[4:].median()
        print(f"{label:<20}{res_off:>15.3f}{res_on:>14.3f}{res_off / res_on:>8.1f}x"
              f"{off.decode_latency * 1e3:>12.2f}{on.decode_latency * 1e3:>11.2f}"
              f"{off.decode_latency / on.decode_latency:>8.2f}x{elided:>12.0f}")


if __name__ == "__main__":
    main()

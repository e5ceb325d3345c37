"""Activation memory on the prefill of the small built-in models.

For each model: one-buffer-per-value bytes, the liveness planner's peak, the lower
bound (largest sum of simultaneously live bytes), planner/lower-bound ratio, and
the measured resident peak of the executor's buffers with release_dead_values off
and on. Usage: python benchmarks/memory.py [--size small] [--prompt 64]
"""

from __future__ import annotations

import argparse

import workbench
from workbench import SessionOptions, models


def prefill(model_bytes: bytes, prompt: list[int], release: bool):
    session = workbench.InferenceSession(model_bytes, options=SessionOptions(release_dead_values=release))
    workbench.Generator(session).generate(prompt, 1, kv="growing", progress=False, eos_token_id=-1)
    return session.recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="small")
    parser.add_argument("--prompt", type=int, default=64)
    args = parser.parse_args()
    prompt = [(7 * i) % 200 + 3 for i in range(args.prompt)]
    mib = 1 / 2**20
    print(f"prefill of {args.prompt} tokens, {args.size} models (MiB)")
    print(f"{'model':<14}{'one/value':>10}{'planner':>9}{'bound':>8}{'ratio':>7}"
          f"{'resident':>10}{'+release':>10}{'saved':>7}")
    for name, build in (("gpt2", models.gpt2), ("llama-onnx", lambda s: models.llama(s, flavor="onnx")),
                        ("llama-genai", lambda s: models.llama(s, flavor="genai")), ("phi3", models.phi3)):
        data = build(args.size).SerializeToString()
        kept = prefill(data, prompt, release=False)
        freed = prefill(data, prompt, release=True)
        row = kept.memory_summary().iloc[0]
        resident = kept.steps().resident_peak_bytes.iloc[0]
        released = freed.steps().resident_peak_bytes.iloc[0]
        ratio = row.planner_peak_bytes / row.lower_bound_bytes
        print(f"{name:<14}{row.one_buffer_per_value_bytes * mib:>10.2f}{row.planner_peak_bytes * mib:>9.2f}"
              f"{row.lower_bound_bytes * mib:>8.2f}{ratio:>7.3f}{resident * mib:>10.2f}{released * mib:>10.2f}"
              f"{1 - released / resident:>7.0%}")


if __name__ == "__main__":
    main()

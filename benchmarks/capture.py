"""Per-token decode latency with captured-segment replay vs eager, same run.

CPU backend always; the CUDA backend too when CuPy finds a GPU (eager CuPy vs
replayed cupy.cuda.Graphs). Also reports the captured coverage (share of node
executions served by a replay after warm-up) and whether every run decoded the same
tokens as the CPU eager run.
Usage: python benchmarks/capture.py [--size small] [--tokens 48] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import workbench
from workbench import Generator, SessionOptions, models

PROMPT = list(range(3, 19))


def decode(data: bytes, backend: str, capture: bool, tokens: int) -> dict:
    options = SessionOptions(capture=capture, decode_memo_verify=False)
    t0 = time.perf_counter()
    session = workbench.InferenceSession(data, options=options, backend=backend)
    result = Generator(session).generate(PROMPT, tokens, kv="fixed", progress=False, eos_token_id=-1)
    timings = session.recording.node_timings()
    events = session.recording.capture_events()
    replays = events[events.event == "replay"]
    after = timings[timings.step >= replays.step.min()] if len(replays) else timings.iloc[0:0]
    return {
        "backend": backend, "capture": capture, "tokens": result.tokens,
        "per_token_ms": result.decode_latency * 1e3,
        "replayed_share": float((timings["mode"] == "replayed").mean()) if capture else 0.0,
        "replayed_share_after_warmup": float((after["mode"] == "replayed").mean()) if len(after) else 0.0,
        "captures": int((events.event == "capture").sum()), "replays": int(len(replays)),
        "retires": int((events.event == "retire").sum()), "wall_s": time.perf_counter() - t0,
    }


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
    parser.add_argument("--flavor", default="genai")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--backends", default="", help="comma list (default: cpu, and cuda with a GPU)")
    parser.add_argument("--json", default="", help="write the rows here as JSON")
    args = parser.parse_args()
    data = models.llama(args.size, flavor=args.flavor).SerializeToString()
    names = args.backends.split(",") if args.backends else backends()
    print(f"llama {args.size} ({args.flavor}), fixed KV, {args.tokens} tokens; per-token latency (median)")
    print(f"{'backend':<9}{'eager ms':>10}{'replay ms':>11}{'speedup':>9}{'replayed':>10}{'tokens':>8}")
    rows, reference = [], None
    for backend in names:
        eager = decode(data, backend, False, args.tokens)
        replay = decode(data, backend, True, args.tokens)
        reference = reference or eager["tokens"]
        same = eager["tokens"] == replay["tokens"] == reference
        speedup = eager["per_token_ms"] / replay["per_token_ms"]
        print(f"{backend:<9}{eager['per_token_ms']:>10.2f}{replay['per_token_ms']:>11.2f}{speedup:>8.2f}x"
              f"{replay['replayed_share_after_warmup']:>9.0%}{'same' if same else 'DIFFER':>8}")
        rows.append({"backend": backend, "eager": eager, "replay": replay, "speedup": speedup,
                     "token_exact_vs_cpu_eager": same})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": f"llama {args.size} {args.flavor}", "tokens": args.tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

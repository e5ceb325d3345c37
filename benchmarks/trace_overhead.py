"""Cost of tracing: per-token decode latency with the Recording on vs off, small exports.

For each small export (workbench's llama in both op flavours, onnxruntime-genai's
builder layout, optimum's merged decoder) prints the trace-off and trace-on decode
latency (the median step over interleaved rounds), the overhead two ways, and
"outside kernels": the share of a traced decode step's wall time not spent inside a
node's kernel (eager node or replayed segment), i.e. the executor's own per-step
work: preparing the step, memo and capture bookkeeping, dispatch, and recording.

The overhead: "pooled", the ratio of the two medians over all rounds' steps; and
"paired", the median over rounds of each round's ratio (its traced decode's median
step over its untraced one's), with a 90% bootstrap interval. On these shared 2-core
machines a whole round often runs slower than the next (a neighbour's load, the
memory bandwidth of the moment), which moves the pooled ratio by several points from
run to run; the paired one compares decodes that ran back to back.

Each export is loaded into several sessions (`--sessions`), and the rounds go round
them in turn: one session's overhead depends on where its weights and buffers landed
in memory (two sessions of the same model in one process have read 4.6% and 8.2%,
each over 24 rounds), so one session is one draw of that lottery. The interval
resamples sessions, then rounds within each; "per session" gives the spread of the
sessions' own paired medians. Every decode starts from a collected heap
(`gc.collect()`), so one mode does not pay the young collections the other's garbage
(or the analysis of a recording) set off.

With `--exports DIR` (a tools/real_exports.py folder, or any folder with a
manifest.json of {"name", "path"} rows, e.g. SmolLM2's genai exports) the rows are
those exports instead, through `Generator` (default options, capture on), a
prefill + decode pair with its prefill session.

Usage: python benchmarks/trace_overhead.py [--tokens 32] [--rounds 3] [--sessions 3]
                                           [--exports DIR] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
from pathlib import Path

import workbench
from workbench import Generator, SessionOptions, models
from workbench.decode.interface import find_export

PROMPT = list(range(3, 19))


def exports(size: str = "small"):
    """(label, model bytes) of each small export; see benchmarks/decode.py `_models`."""
    yield "llama small (onnx)", models.llama(size, flavor="onnx").SerializeToString()
    yield "llama small (genai)", models.llama(size, flavor="genai").SerializeToString()
    yield "genai builder", models.llama(size, flavor="genai", export="genai-builder").SerializeToString()
    yield "optimum merged", models.llama(size, flavor="onnx", export="optimum-merged").SerializeToString()


def real_exports(folder: Path, only: str):
    """(label, model path) of each export a manifest lists."""
    for entry in json.loads((folder / "manifest.json").read_text()):
        if only in entry["name"]:
            yield entry["name"], entry["path"]


def open_sessions(source, count: int) -> list[tuple[workbench.InferenceSession, object]]:
    """`count` (decode session, prefill session or None) pairs of one export."""
    options = SessionOptions(trace=True)
    if isinstance(source, bytes):
        return [(workbench.InferenceSession(source, options=options), None) for _ in range(count)]
    files = find_export(source)
    return [(workbench.InferenceSession(str(files.decode), options=options),
             workbench.InferenceSession(str(files.prefill), options=options) if files.prefill else None)
            for _ in range(count)]


def decode(pair, tokens: int, traced: bool) -> tuple[list[float], float]:
    """(the decode steps' wall times in s, median share of a decode step outside kernels;
    nan untraced), for one generation: in a fresh recording, or with the trace stopped.
    Each starts from a collected heap, so neither pays for garbage the other left."""
    session, prefill = pair
    for s in (session, prefill):
        if s is not None:
            s.new_recording() if traced else s.stop_recording()
    gc.collect()
    result = Generator(session, prefill=prefill).generate(PROMPT, tokens, progress=False,
                                                          eos_token_id=-1)
    steps = result.step_times[2:]  # the prefill and the first (re-planning) step left out
    return steps, outside_kernels(session.recording) if traced else float("nan")


def paired_overhead(rounds: list[list[tuple[float, float]]], draws: int = 2000) -> tuple[float, float, float]:
    """(median, 5th, 95th percentile of bootstrap medians) of the rounds' on/off ratios,
    less one; `rounds` holds each session's (off, on) rounds, and every draw resamples
    sessions, then rounds within each drawn session."""
    ratios = [[on / off for off, on in session] for session in rounds]
    rng = random.Random(0)
    medians = sorted(statistics.median([r for session in rng.choices(ratios, k=len(ratios))
                                        for r in rng.choices(session, k=len(session))])
                     for _ in range(draws))
    return (statistics.median([r for session in ratios for r in session]) - 1,
            medians[int(0.05 * draws)] - 1, medians[int(0.95 * draws) - 1] - 1)


def outside_kernels(rec: workbench.Recording) -> float:
    """Median over decode steps of 1 - (sum of the step's node durations) / step wall time."""
    steps = rec.steps()
    wall = dict(zip(steps["step"], steps["wall_ms"] / 1e3))
    decoding = set(steps["step"][steps["phase"] == "decode"])
    nodes = rec.node_timings()
    kernels = (nodes["duration_us"] / 1e6).groupby(nodes["step"]).sum()
    shares = [1 - kernels.get(s, 0.0) / wall[s] for s in decoding if wall[s] > 0]
    return statistics.median(shares) if shares else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per session")
    parser.add_argument("--sessions", type=int, default=3, help="sessions (memory layouts) per export")
    parser.add_argument("--exports", type=Path, default=None, help="a folder with a manifest.json of exports")
    parser.add_argument("--only", default="", help="exports whose name contains this")
    args = parser.parse_args()
    print(f"per-token decode latency, {args.tokens} tokens: the median decode step of {args.rounds} "
          f"interleaved rounds in each of {args.sessions} sessions, each its trace on and off in turn "
          "(the same weights and buffers both ways; the order flips each round, so drift and a noisy "
          "neighbour weigh alike); per session: the lowest and highest session's paired median; "
          "outside kernels: share of a traced decode step (median) not inside a node's kernel")
    rows = real_exports(args.exports, args.only) if args.exports else exports()
    print(f"{'model':<20}{'trace off ms':>14}{'trace on ms':>13}{'pooled':>9}{'paired [90% interval]':>27}"
          f"{'per session':>16}{'outside kernels':>17}")
    for label, data in rows:
        sessions = open_sessions(data, args.sessions)
        steps: dict[bool, list[float]] = {False: [], True: []}
        rounds: list[list[tuple[float, float]]] = [[] for _ in sessions]
        shares = []
        for round_ in range(args.rounds):
            for i, session in enumerate(sessions):
                medians = {}
                for trace in ((True, False) if (round_ + i) % 2 else (False, True)):
                    got, share = decode(session, args.tokens, trace)
                    steps[trace] += got
                    medians[trace] = statistics.median(got)
                    if trace:
                        shares.append(share)
                rounds[i].append((medians[False], medians[True]))
        del sessions
        off, on = statistics.median(steps[False]), statistics.median(steps[True])
        paired, low, high = paired_overhead(rounds)
        each = [statistics.median(on_ / off_ for off_, on_ in session) - 1 for session in rounds]
        print(f"{label:<20}{off * 1e3:>14.2f}{on * 1e3:>13.2f}{on / off - 1:>9.1%}"
              f"{f'{paired:.1%} [{low:.1%}, {high:.1%}]':>27}{f'{min(each):.1%}..{max(each):.1%}':>16}"
              f"{statistics.median(shares):>17.1%}")


if __name__ == "__main__":
    main()

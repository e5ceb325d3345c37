"""Cost of tracing: per-token decode latency with the Recording off, full and lean.

For each small export (workbench's llama in both op flavours, onnxruntime-genai's
builder layout, optimum's merged decoder) prints the decode latency (the median step
over interleaved rounds) untraced, traced in full, and traced lean (without the memory
tables: liveness, io_buffers, views, buffer events, aliases, materializations;
`SessionOptions(trace_memory=False)`); each traced form's overhead; and "outside
kernels": the share of a fully traced decode step's wall time not spent inside a
node's kernel (eager node or replayed segment), i.e. the executor's own per-step
work: preparing the step, memo and capture bookkeeping, dispatch, and recording.

The overhead is "paired": the median over rounds of each round's ratio (its traced
decode's median step over its untraced one's), with a 90% bootstrap interval. On
these shared 2-core machines a whole round often runs slower than the next (a
neighbour's load, the memory bandwidth of the moment), which moves a ratio of pooled
medians by several points from run to run; the paired one compares decodes that ran
back to back.

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


def decode(pair, tokens: int, mode: str) -> tuple[list[float], float]:
    """(the decode steps' wall times in s, median share of a decode step outside kernels;
    nan untraced), for one generation: `mode` "off" with the trace stopped, "full" in a
    fresh recording, "lean" in a fresh one without the memory tables
    (`SessionOptions.trace_memory` off). Each starts from a collected heap, so no mode
    pays for garbage another left."""
    session, prefill = pair
    for s in (session, prefill):
        if s is None:
            continue
        if mode == "off":
            s.stop_recording()
        else:
            s.options.trace_memory = mode == "full"  # read by new_recording
            s.new_recording()
    gc.collect()
    result = Generator(session, prefill=prefill).generate(PROMPT, tokens, progress=False,
                                                          eos_token_id=-1)
    steps = result.step_times[2:]  # the prefill and the first (re-planning) step left out
    return steps, outside_kernels(session.recording) if mode != "off" else float("nan")


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


TRACED = ("full", "lean")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per session")
    parser.add_argument("--sessions", type=int, default=3, help="sessions (memory layouts) per export")
    parser.add_argument("--exports", type=Path, default=None, help="a folder with a manifest.json of exports")
    parser.add_argument("--only", default="", help="exports whose name contains this")
    args = parser.parse_args()
    print(f"per-token decode latency, {args.tokens} tokens: the median decode step of {args.rounds} "
          f"interleaved rounds in each of {args.sessions} sessions, each its trace off, full and lean in turn "
          "(the same weights and buffers every way; the order rotates each round, so drift and a noisy "
          "neighbour weigh alike); full: every table; lean: without the memory tables "
          "(SessionOptions(trace_memory=False)); per session: the lowest and highest session's paired "
          "median; outside kernels: share of a fully traced decode step (median) not inside a node's kernel")
    rows = real_exports(args.exports, args.only) if args.exports else exports()
    print(f"{'model':<28}{'off ms':>8}{'full ms':>9}{'lean ms':>9}{'full: paired [90% interval]':>31}"
          f"{'per session':>16}{'lean: paired [90% interval]':>31}{'outside kernels':>17}")
    for label, data in rows:
        sessions = open_sessions(data, args.sessions)
        steps: dict[str, list[float]] = {"off": [], **{m: [] for m in TRACED}}
        rounds: dict[str, list[list[tuple[float, float]]]] = {m: [[] for _ in sessions] for m in TRACED}
        shares = []
        modes = ("off", *TRACED)
        for round_ in range(args.rounds):
            for i, session in enumerate(sessions):
                medians = {}
                turn = (round_ + i) % len(modes)
                for mode in modes[turn:] + modes[:turn]:
                    got, share = decode(session, args.tokens, mode)
                    steps[mode] += got
                    medians[mode] = statistics.median(got)
                    if mode == "full":
                        shares.append(share)
                for mode in TRACED:
                    rounds[mode][i].append((medians["off"], medians[mode]))
        del sessions
        cells = []
        for mode in TRACED:
            paired, low, high = paired_overhead(rounds[mode])
            cells.append(f"{f'{paired:.1%} [{low:.1%}, {high:.1%}]':>31}")
            if mode == "full":
                each = [statistics.median(on_ / off_ for off_, on_ in session) - 1 for session in rounds[mode]]
                cells.append(f"{f'{min(each):.1%}..{max(each):.1%}':>16}")
        medians = {m: statistics.median(v) * 1e3 for m, v in steps.items()}
        print(f"{label:<28}{medians['off']:>8.3f}{medians['full']:>9.3f}{medians['lean']:>9.3f}"
              f"{''.join(cells)}{statistics.median(shares):>17.1%}")


if __name__ == "__main__":
    main()

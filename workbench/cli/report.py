"""Decode a model while recording everything, write `workbench-report/`, print a summary.

Shared by `workbench demo` (a fixed chat on SmolLM2 or a built-in model) and
`workbench report MODEL.onnx` (a model a user brings).
"""

from __future__ import annotations

import argparse
import html
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class ReportRun:
    """What `run_report` did: the exit code, both runtimes' results, the sessions by graph."""

    code: int
    ours: Any  # GenerationResult
    peer: Any = None  # GenerationResult of onnxruntime through the same loop, or None
    sessions: dict[str, Any] = field(default_factory=dict)  # graph ("model" | "prefill" | "decode") -> session
    generator: Any = None
    #: why onnxruntime could not run the loop (one line), or None
    peer_error: str | None = None


def decode_and_report(model: Any, prompt: list[int], steps: int, *, out_dir: str | Path,
                      backend: str = "cpu", kv: str = "auto", eos_token_id: int | None = None,
                      on_token: Callable[[int], None] | None = None, label: str = "",
                      prefill: Any = None, overrides: dict | None = None, peer_profile: bool = True) -> int:
    """Decode `model` (with `prefill`, a second graph that runs the prompt) while recording
    everything; write the report; print a summary; 0 when onnxruntime agrees token for token."""
    return run_report(model, prompt, steps, out_dir=out_dir, backend=backend, kv=kv,
                      eos_token_id=eos_token_id, on_token=on_token, label=label, prefill=prefill,
                      overrides=overrides, peer_profile=peer_profile).code


def run_report(model: Any, prompt: list[int], steps: int, *, out_dir: str | Path,
               backend: str = "cpu", kv: str = "auto", eos_token_id: int | None = None,
               on_token: Callable[[int], None] | None = None, label: str = "",
               prefill: Any = None, overrides: dict | None = None, return_logits: bool = False,
               peer_profile: bool = True) -> ReportRun:
    """`decode_and_report`, returning what it did. `peer_profile`: decode once more with
    onnxruntime's profiler on (a run of its own, so the timed run stays unprofiled) and
    carry its per-node kernel times in the recording (reports.join_peer_profile)."""
    from .. import Generator, InferenceSession  # noqa: PLC0415
    from ..reports import (  # noqa: PLC0415
        LATENCY_DEFINITION,
        PEER_TABLE,
        decode_latency,
        per_token_ms,
        summary_text,
    )

    overrides = overrides or {}
    session = InferenceSession(model, backend=backend)
    pre = InferenceSession(prefill, backend=backend) if prefill is not None else None
    gen = Generator(session, prefill=pre, **overrides)
    sessions = {"model": session} if pre is None else {"prefill": pre, "decode": session}
    # a streaming caller draws its own progress line (text and bar share the terminal)
    result = gen.generate(prompt, steps, kv=kv, eos_token_id=eos_token_id, progress=on_token is None,
                          on_token=on_token, return_logits=return_logits)
    if on_token is not None:
        on_token(None)  # the stream's end
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # onnxruntime first: its latency and profile go into the recording, so the summary
    # and the HTML report show "workbench / onnxruntime" as this output does
    peer_error = None
    try:
        peer, peer_runs = _peer(model, prefill, prompt, len(result.tokens), kv, overrides, return_logits)
    except Exception as e:  # noqa: BLE001 - onnxruntime's failure is reported, ours stands
        peer, peer_runs, peer_error = None, [], _one_line(e)
    # one definition (reports.latency): the decode graph's runs' wall time per generated token
    ours_ms = decode_latency(session.recording)["ms_per_token"]
    peer_ms = per_token_ms(peer_runs, len(peer.tokens) - 1) if peer is not None else None
    if peer is not None and session.recording is not None:
        session.recording.add_row(PEER_TABLE, runtime="onnxruntime", ms_per_token=peer_ms,
                                  tokens_per_s=1e3 / peer_ms, decode_runs=len(peer_runs),
                                  decode_tokens=len(peer.tokens) - 1, tokens_identical=peer.tokens == result.tokens,
                                  definition=LATENCY_DEFINITION)
        if peer_profile:
            _attach_peer_profile(session.recording, model, prefill, prompt, len(result.tokens), kv, overrides, out)
    _write_reports(sessions, out, label, {"model": model, "prefill": prefill, "decode": model})
    print(f"\n{label}: {len(result.tokens)} tokens, KV cache {result.kv_mode}"
          f"{' (shared past/present buffer)' if result.shared_buffer else ''}")
    for graph, sess in sessions.items():
        if pre is not None:
            print(f"\n== {graph} graph ==")
        print(summary_text(sess.recording))
    print(f"\n[latency] {LATENCY_DEFINITION}, each runtime's decode runs timed alike")
    print(f"  workbench     {ours_ms:8.3f} ms/token  {1e3 / ours_ms:7.1f} tokens/s  (as in the summary)")
    if peer_error is not None:
        print(f"  onnxruntime   could not run the decode loop, no comparison: {peer_error}")
    elif peer is None:
        print("  onnxruntime   not installed: no comparison")
    else:
        same = peer.tokens == result.tokens
        print(f"  onnxruntime   {peer_ms:8.3f} ms/token  {1e3 / peer_ms:7.1f} tokens/s")
        print(f"  workbench / onnxruntime: {ours_ms / peer_ms:.2f}x; tokens {'identical' if same else 'DIFFERENT'}")
    print("  where each step's time goes: [time] above (reports.step_breakdown; its parts sum to the wall time)")
    frames = out / "frames"
    print(f"\nreport: {out / 'report.html'}  frames: {frames}/" + ("{prefill,decode}/" if pre is not None else ""))
    code = 0 if peer is None or peer.tokens == result.tokens else 1
    return ReportRun(code, result, peer, sessions, gen, peer_error)


def _one_line(e: Exception) -> str:
    """An exception as one line: its type and the first line of its message (onnxruntime's
    messages carry its source path and a status prefix: the gist is kept, capped)."""
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    if len(text) > 300:
        text = text[:300] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _write_reports(sessions: dict[str, Any], out: Path, label: str, sources: dict[str, Any]) -> None:
    """One graph: `report.html` + `frames/`. A prefill + decode pair: each graph's own report
    (`prefill.html`, `decode.html`) and frames (`frames/prefill/`, `frames/decode/`), and a
    `report.html` that shows both: the graphs, every step in run order tagged with the graph
    that ran it, and each graph's report inline."""
    from ..reports import export, to_chrome_trace, to_html  # noqa: PLC0415

    if set(sessions) == {"model"}:
        rec = sessions["model"].recording
        to_html(rec, out / "report.html", title=f"Workbench report: {label}" if label else "Workbench recording")
        export(rec, out / "frames")
        to_chrome_trace(rec, out / "trace.json")  # open in ui.perfetto.dev
        return
    for graph, sess in sessions.items():
        to_html(sess.recording, out / f"{graph}.html", title=f"{label}: the {graph} graph ({_name(sources[graph])})")
        export(sess.recording, out / "frames" / graph)
        to_chrome_trace(sess.recording, out / f"trace-{graph}.json")
    (out / "report.html").write_text(_pair_index(sessions, label, sources), encoding="utf-8")


def _name(source: Any) -> str:
    return Path(source).name if isinstance(source, (str, Path)) else "in memory"


def _pair_index(sessions: dict[str, Any], label: str, sources: dict[str, Any]) -> str:
    import pandas as pd  # noqa: PLC0415

    from ..reports import latency_frame, tokens_frame  # noqa: PLC0415
    from ..reports.html import table_html  # noqa: PLC0415

    rows, graphs = [], []
    for graph, sess in sessions.items():
        st = latency_frame(sess.recording)
        tok = tokens_frame(sess.recording).drop_duplicates("step", keep="last").set_index("step")["token"]
        st["token"] = st["step"].map(tok)
        graphs.append({"graph": graph, "file": _name(sources[graph]), "steps": len(st),
                       "phases": ", ".join(dict.fromkeys(st["phase"])), "nodes": len(sess.plan.nodes),
                       "report": f"{graph}.html", "frames": f"frames/{graph}/"})
        for _, r in st.iterrows():
            rows.append({"run": None, "graph": graph, "step": int(r["step"]), "slot": r["slot"],
                         "phase": r["phase"], "wall_ms": round(float(r["wall_ms"]), 3),
                         "token": None if pd.isna(r["token"]) else int(r["token"])})
    # runs alternate by phase: the prefill graph's one run comes first
    rows.sort(key=lambda r: (r["graph"] != "prefill", r["step"]))
    for i, r in enumerate(rows):
        r["run"] = i

    title = f"Workbench report: {label}" if label else "Workbench report"
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
             "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
             "td,th{padding:2px 8px;border-bottom:1px solid #ddd}iframe{width:100%;height:80vh;border:1px solid #ccc}"
             "</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             "<p>Two graphs: the prefill graph runs the prompt once and starts the KV cache; the decode "
             "graph runs every later step. Each has its own recording, report and frames.</p>",
             "<h2 id=\"graphs\">Graphs</h2>", table_html(pd.DataFrame(graphs)),
             "<h2 id=\"runs\">Every run, in order, with the graph that ran it</h2>", table_html(pd.DataFrame(rows))]
    for graph in sessions:
        parts.append(f"<h2 id=\"{graph}\">The {graph} graph (<a href=\"{graph}.html\">{graph}.html</a>)</h2>"
                     f"<iframe src=\"{graph}.html\" title=\"{graph} graph report\"></iframe>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


class _TimedRuns:
    """An onnxruntime session whose run / run_with_iobinding calls are timed (wall seconds
    each, in order), so its decode runs are measured as workbench records its own."""

    def __init__(self, session: Any):
        self._session = session
        self.seconds: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def _timed(self, fn, *args):
        import time  # noqa: PLC0415

        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds.append(time.perf_counter() - t0)

    def run(self, *args):
        return self._timed(self._session.run, *args)

    def run_with_iobinding(self, *args):
        return self._timed(self._session.run_with_iobinding, *args)


def _peer(model: Any, prefill: Any, prompt: list[int], steps: int, kv: str, overrides: dict,
          return_logits: bool, profile_prefix: Path | None = None):
    """onnxruntime through the same Generator loop: (its GenerationResult, the wall seconds
    of its decode runs -- the prefill run left out), or (None, []) without onnxruntime.
    With `profile_prefix`: (the decode session's profile file, its prefill runs) instead."""
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError:
        return None, []
    from .. import Generator  # noqa: PLC0415

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(profile_prefix)

    def open_(source: Any):
        source = source if isinstance(source, (str, Path)) else source.SerializeToString()
        return ort.InferenceSession(str(source) if isinstance(source, Path) else source, opts,
                                    providers=["CPUExecutionProvider"])

    pre = open_(prefill) if prefill is not None else None
    decode = _TimedRuns(open_(model))
    result = Generator(decode, prefill=pre, **overrides).generate(
        prompt, steps, kv=kv, eos_token_id=-1, progress=False, return_logits=return_logits)
    if profile_prefix is not None:
        if pre is not None:
            pre.end_profiling()  # the prefill graph's own file: not compared here
        return Path(decode.end_profiling()), 0 if pre is not None else 1
    return result, decode.seconds if pre is not None else decode.seconds[1:]


def _attach_peer_profile(rec: Any, model: Any, prefill: Any, prompt: list[int], steps: int, kv: str,
                         overrides: dict, out: Path) -> None:
    """onnxruntime's per-node profile of a decode of its own, into the recording's
    `peer_profile` table (reports.peer_profile's columns); a failure is printed, not raised."""
    from ..reports import PROFILE_COLUMNS, peer_profile  # noqa: PLC0415

    try:
        path, prefill_runs = _peer(model, prefill, prompt, steps, kv, overrides, False,
                                   profile_prefix=out / "onnxruntime_profile")
        if path is None:
            return
        prof = peer_profile(path, skip_runs=prefill_runs)
    except Exception as e:  # noqa: BLE001 - the comparison is extra; the report stands without it
        print(f"onnxruntime's profile could not be read: {_one_line(e)}")
        return
    rec.add_rows("peer_profile", tuple(PROFILE_COLUMNS),
                 [tuple(r) for r in prof[PROFILE_COLUMNS].itertuples(index=False, name=None)])


def cmd_report(args: argparse.Namespace) -> int:
    from .. import InferenceSession  # noqa: PLC0415
    from ..decode import DecodeInterfaceError, check, discover, find_export  # noqa: PLC0415

    files = find_export(args.model)
    overrides: dict[str, Any] = {}
    if args.head_size is not None:
        overrides["head_size"] = args.head_size
    if args.kv_map:
        pairs = [item.partition("=") for item in args.kv_map]
        bad = [item for item, (_, eq, present) in zip(args.kv_map, pairs) if not eq or not present]
        if bad:
            raise DecodeInterfaceError(f"--kv-map {bad[0]!r}: expected PAST_INPUT=PRESENT_OUTPUT")
        overrides["kv_map"] = {past: present for past, _, present in pairs}
    if files.head_size_hint():
        overrides["config_head_size"] = files.head_size_hint()
    # read each graph first: fails early, naming the inputs it cannot interpret
    probes = {"decode" if files.prefill else "model": files.decode}
    if files.prefill:
        probes = {"prefill": files.prefill, **probes}
    vocab = 1000
    print(f"{args.model}: {files.layout}" + (f" ({files.config_file} beside it)" if files.config_file else ""))
    for graph, path in probes.items():
        probe = InferenceSession(path, options=_no_trace())
        kw = dict(overrides)
        if graph == "prefill":
            kw.pop("kv_map", None)
        interface = check(discover(probe, graph=f"{path.name}", **kw))
        print(interface.describe())
        logits = next(a for a in probe.get_outputs() if a.name == interface.logits)
        last = (logits.shape or [None])[-1]
        last = int(last) if isinstance(last, str) and last.isdigit() else last
        vocab = last if isinstance(last, int) else vocab
    prompt = np.random.default_rng(0).integers(0, vocab, size=args.prompt_tokens).tolist()
    return decode_and_report(str(files.decode), prompt, args.steps, out_dir=args.out, backend=args.backend,
                             kv=args.kv, eos_token_id=-1, label=str(args.model),
                             prefill=str(files.prefill) if files.prefill else None, overrides=overrides,
                             peer_profile=args.peer_profile)


def _no_trace():
    from .. import SessionOptions  # noqa: PLC0415

    return SessionOptions(trace=False)


def add_parser(sub) -> None:
    report = sub.add_parser("report", help="decode your model with everything recorded; write an HTML report")
    report.add_argument("model", help="an exported decoder: a .onnx file (onnxruntime-genai, optimum, torch.onnx) "
                                      "or its folder (transformers' prefill.onnx + decode.onnx, genai's model.onnx)")
    report.add_argument("--prompt-tokens", type=int, default=16)
    report.add_argument("--steps", type=int, default=32)
    report.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    report.add_argument("--kv", choices=["auto", "growing", "fixed"], default="auto")
    report.add_argument("--head-size", type=int, default=None,
                        help="the KV head size, where the graph does not say it")
    report.add_argument("--kv-map", action="append", metavar="PAST=PRESENT",
                        help="pair a past K/V input with its present output (names no pattern knows)")
    report.add_argument("--out", default="workbench-report")
    report.add_argument("--no-peer-profile", dest="peer_profile", action="store_false",
                        help="skip the second onnxruntime decode with its profiler on (the per-node comparison)")
    report.set_defaults(func=cmd_report)


def stream_printer(tokenizer: Any, total: int) -> Callable[[int | None], None]:
    """Streams the reply on one progress line (tokens/s and the text's tail), then
    prints the whole reply when called with None."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    stream = tokenizer.stream()
    bar = tqdm(total=total, unit="tok", desc="decode", leave=False, file=sys.stdout)

    def emit(token: int | None) -> None:
        if token is None:
            bar.close()
            print("assistant:", stream.text.strip())
            return
        stream.step(token)
        bar.update(1)
        bar.set_postfix_str("…" + stream.text[-48:].replace("\n", " "), refresh=True)

    return emit

"""Decode a model while recording everything, write `workbench-report/`, print a summary.

Shared by `workbench demo` (a fixed chat on SmolLM2 or a built-in model) and
`workbench report MODEL.onnx` (a model a user brings).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def decode_and_report(model: Any, prompt: list[int], steps: int, *, out_dir: str | Path,
                      backend: str = "cpu", kv: str = "auto", eos_token_id: int | None = None,
                      on_token: Callable[[int], None] | None = None, label: str = "") -> int:
    from .. import Generator, InferenceSession  # noqa: PLC0415
    from ..reports import export, summary_text, to_html  # noqa: PLC0415

    session = InferenceSession(model, backend=backend)
    # a streaming caller draws its own progress line (text and bar share the terminal)
    result = Generator(session).generate(prompt, steps, kv=kv, eos_token_id=eos_token_id,
                                         progress=on_token is None, on_token=on_token)
    if on_token is not None:
        on_token(None)  # the stream's end
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    to_html(session.recording, out / "report.html")
    export(session.recording, out / "frames")
    print(f"\n{label}: {len(result.tokens)} tokens, KV cache {result.kv_mode}"
          f"{' (shared past/present buffer)' if result.shared_buffer else ''}")
    print(summary_text(session.recording))
    peer = _peer_latency(model, prompt, len(result.tokens), kv)
    ours_ms = result.per_token_latency * 1e3
    print("\n[latency]")
    print(f"  workbench     {ours_ms:8.2f} ms/token  {1e3 / ours_ms:7.1f} tokens/s")
    if peer is None:
        print("  onnxruntime   not installed: no comparison")
    else:
        peer_ms, same = peer.per_token_latency * 1e3, peer.tokens == result.tokens
        print(f"  onnxruntime   {peer_ms:8.2f} ms/token  {1e3 / peer_ms:7.1f} tokens/s")
        print(f"  workbench / onnxruntime: {ours_ms / peer_ms:.2f}x; tokens {'identical' if same else 'DIFFERENT'}")
    print(f"\nreport: {out / 'report.html'}  frames: {out / 'frames'}/")
    return 0 if peer is None or peer.tokens == result.tokens else 1


def _peer_latency(model: Any, prompt: list[int], steps: int, kv: str):
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError:
        return None
    from .. import Generator  # noqa: PLC0415

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    source = model if isinstance(model, (str, Path)) else model.SerializeToString()
    peer = ort.InferenceSession(str(source) if isinstance(source, Path) else source, opts,
                                providers=["CPUExecutionProvider"])
    return Generator(peer).generate(prompt, steps, kv=kv, eos_token_id=-1, progress=False)


def cmd_report(args: argparse.Namespace) -> int:
    from .. import InferenceSession  # noqa: PLC0415
    from ..decode import discover  # noqa: PLC0415

    probe = InferenceSession(args.model, options=_no_trace())
    discover(probe)  # fails early, naming inputs it cannot interpret
    vocab = next((d for d in (probe.get_outputs()[0].shape or [])[-1:] if isinstance(d, int)), 1000)
    prompt = np.random.default_rng(0).integers(0, vocab, size=args.prompt_tokens).tolist()
    return decode_and_report(args.model, prompt, args.steps, out_dir=args.out, backend=args.backend,
                             kv=args.kv, eos_token_id=-1, label=str(args.model))


def _no_trace():
    from .. import SessionOptions  # noqa: PLC0415

    return SessionOptions(trace=False)


def add_parser(sub) -> None:
    report = sub.add_parser("report", help="decode your model with everything recorded; write an HTML report")
    report.add_argument("model", help="an exported decoder (onnxruntime-genai, optimum or torch.onnx)")
    report.add_argument("--prompt-tokens", type=int, default=16)
    report.add_argument("--steps", type=int, default=32)
    report.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    report.add_argument("--kv", choices=["auto", "growing", "fixed"], default="auto")
    report.add_argument("--out", default="workbench-report")
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

"""Does capture hold on the exports people bring? Per export idiom and loop, capture on
against capture off in the same run.

    python benchmarks/capture_holds.py [--exports DIR] [--tokens 24] [--backend cpu|cuda] [--json OUT]

Rows: the project's builders in each exporter's idiom, plus every export of
`tools/real_exports.py`'s set when --exports names it (its manifest.json). Loops:
`gen` is `Generator(kv="fixed")`; `run` is a plain `session.run` loop as onnxruntime
users write it (fresh numpy feeds each step, the presents fed back as the next pasts).
Columns: replayed share of node time after warm-up (steps >= 6), steps that recorded
again and retires per 100 tokens after warm-up (0 when graphs hold), ms/token with capture on and off
and their ratio, and whether both decoded the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from loops import WARM, generator_loop, plain_loop  # noqa: E402

import workbench  # noqa: E402
from workbench import SessionOptions, models, reports  # noqa: E402
from workbench.decode.interface import find_export  # noqa: E402
from workbench.models import exports  # noqa: E402


def builder_rows() -> dict:
    folder = tempfile.mkdtemp(prefix="wb-transformers-")
    models.transformers_export(folder)
    return {
        "builder: genai builder": models.llama("tiny", flavor="genai", export="genai-builder"),
        "builder: torch-style onnx ops": models.llama("tiny"),
        "builder: GQA without mask (ORT fused)": exports.fused_gqa_without_mask(models.llama("tiny", flavor="genai")),
        "builder: optimum merged": models.llama("tiny", export="optimum-merged"),
        "builder: torch Attention-23": models.llama("tiny", export="torch-dynamo-attention"),
        "builder: transformers prefill+decode": folder,
        "builder: gpt2": models.gpt2("tiny"),
    }


def sessions(model, backend: str, capture: bool):
    options = SessionOptions(trace=True, capture=capture, decode_memo_verify=False)
    if isinstance(model, (str, Path)):
        files = find_export(model)
        prefill = workbench.InferenceSession(str(files.prefill), options, backend=backend) if files.prefill else None
        return workbench.InferenceSession(str(files.decode), options, backend=backend), prefill
    return workbench.InferenceSession(model, options, backend=backend), None


def measure(model, backend: str, loop, tokens: int) -> dict:
    row = {}
    for capture in (True, False):
        session, prefill = sessions(model, backend, capture)
        got, ms = loop(session, prefill, tokens)
        row[f"ms_{'on' if capture else 'off'}"] = ms
        row[f"tokens_{'on' if capture else 'off'}"] = got
        if capture:
            rec = session.recording
            cov = reports.capture_coverage(rec)
            cov = cov[cov["step"] >= WARM]
            row["replayed_share"] = float(cov["replayed_us"].sum() / max(cov["time_us"].sum(), 1e-12))
            ev = rec.capture_events()
            late = ev[ev["step"] >= WARM]
            steady = max(tokens - WARM, 1)
            # steps that recorded graphs again (each records every segment of the slot)
            row["captures_per_100"] = 100 * late.loc[late["event"] == "capture", "step"].nunique() / steady
            row["retires_per_100"] = 100 * int((late["event"] == "retire").sum()) / steady
            churn = reports.churn_lines(rec, limit=1)
            row["churn"] = churn[0] if churn else ""
    row["ratio_on_off"] = row["ms_on"] / row["ms_off"]
    row["same_tokens"] = row["tokens_on"] == row["tokens_off"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exports", type=Path, default=None, help="a tools/real_exports.py folder (manifest.json)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--only", default="", help="rows whose name contains this")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.backend == "cuda":
        try:
            import cupy

            gpu = cupy.cuda.is_available()
        except Exception:  # noqa: BLE001 - no CuPy or no driver
            gpu = False
        if not gpu:
            os.environ.setdefault("WORKBENCH_CUDA_DOUBLE", "1")  # the double: counts, not speed
    rows = dict(builder_rows())
    if args.exports is not None and (args.exports / "manifest.json").is_file():
        for e in json.loads((args.exports / "manifest.json").read_text()):
            rows[f"{e['exporter'].split(' (')[0].split(':')[0]}: {e['name']}"] = e["path"]
    print(f"{args.tokens} tokens, backend {args.backend}; after warm-up (steps >= {WARM})")
    print(f"{'export':<52}{'loop':<5}{'replayed':>9}{'capt/100':>9}{'ret/100':>8}{'ms on':>8}{'ms off':>8}"
          f"{'on/off':>7}  tokens")
    out = []
    for name, model in rows.items():
        if args.only and args.only not in name:
            continue
        for loop_name, loop in (("gen", generator_loop), ("run", plain_loop)):
            try:
                r = measure(model, args.backend, loop, args.tokens)
            except Exception as error:  # noqa: BLE001 - a row that cannot run says why and the rest go on
                print(f"{name:<52}{loop_name:<5}ERROR {type(error).__name__}: {str(error)[:120]}", flush=True)
                out.append({"export": name, "loop": loop_name, "error": f"{type(error).__name__}: {error}"})
                continue
            print(f"{name:<52}{loop_name:<5}{r['replayed_share']:>8.0%}{r['captures_per_100']:>9.1f}"
                  f"{r['retires_per_100']:>8.1f}{r['ms_on']:>8.2f}{r['ms_off']:>8.2f}{r['ratio_on_off']:>7.2f}  "
                  f"{'same' if r['same_tokens'] else 'DIFFER'}", flush=True)
            if r["churn"]:
                print(f"{'':<57}{r['churn']}")
            out.append({"export": name, "loop": loop_name,
                        **{k: v for k, v in r.items() if not k.startswith("tokens_")}})
    if args.json:
        args.json.write_text(json.dumps({"tokens": args.tokens, "backend": args.backend, "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Decode every export of tools/real_exports.py with workbench and compare with onnxruntime.

    python tools/real_export_survey.py [--manifest /tmp/real_exports/manifest.json]
                                       [--backend cpu|cuda-double|cuda|all] [--only SUBSTRING]
                                       [--json FILE] [--timeout S]

For each manifest entry: `workbench.decode.find_export` on its folder (or file), a
`workbench.InferenceSession` per graph with default options, and `workbench.Generator`
(prefill + decode for transformers' two-graph exports) greedy-decoding the manifest's
prompt for as many tokens as onnxruntime did (12), `kv="fixed"` (`--kv` to change), no EOS stop. The tokens
are compared with the manifest's `ort_tokens` (plain onnxruntime, recorded when the
export was built).

Backends: `cpu` (numpy); `cuda-double` (backend="cuda" on the test-only CuPy double:
WORKBENCH_CUDA_DOUBLE=1 with the repository's tests/ folder on PYTHONPATH); `cuda`
(a real GPU with CuPy); `all` = cpu and cuda-double (the default). Each export runs in
a subprocess of its own, so one crash or hang does not stop the survey. One row per
export: name, then per backend `ok`, `DIFF@i` (first differing token index), `ERR` or
`TIMEOUT`, then the error's last line; below the table, each failure again with where it
was raised and the exception it started from (file:line), or the differing tokens. The exit code is 0
whatever the rows say. Takes about 2-5 s per export and backend on a 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def decode_one(entry: dict, backend: str, kv: str = "fixed") -> dict:
    """Runs inside the subprocess: decode one export with workbench, return a result dict."""
    import traceback

    sys.path.insert(0, str(REPO))
    try:
        import workbench
        from workbench.decode import find_export

        path = Path(entry["path"])
        files = None
        if path.is_file():  # the folder gives find_export the config beside the model
            try:
                files = find_export(path.parent)
                if Path(files.decode).resolve() != path.resolve():
                    files = None
            except Exception:  # noqa: BLE001 - fall back to the file itself
                files = None
        if files is None:
            files = find_export(path)
        overrides = {}
        hint = files.head_size_hint()
        if hint:
            overrides["config_head_size"] = hint
        t0 = time.time()
        wb_backend = "cuda" if backend in ("cuda", "cuda-double") else "cpu"
        decode = workbench.InferenceSession(str(files.decode), backend=wb_backend)
        prefill = workbench.InferenceSession(str(files.prefill), backend=wb_backend) if files.prefill else None
        load_s = time.time() - t0
        gen = workbench.Generator(decode, prefill=prefill, **overrides)
        n = len(entry["ort_tokens"])
        res = gen.generate(entry["prompt"], n, kv=kv, eos_token_id=-1, progress=False)
        want = entry["ort_tokens"]
        got = list(map(int, res.tokens))
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if first is None and len(got) != len(want):
            first = min(len(got), len(want))
        return dict(ok=first is None, tokens=got, first_diff=first, load_s=round(load_s, 2),
                    layout=files.layout, kv_mode=res.kv_mode, shared_buffer=res.shared_buffer,
                    backend=f"{type(decode.backend).__name__} ({getattr(decode.backend.xp, '__name__', '?')})")
    except BaseException as e:  # noqa: BLE001 - the survey reports every failure
        tb = traceback.format_exc()

        def where(exc):
            frames = traceback.extract_tb(exc.__traceback__)
            return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""

        root = e  # the exception the chain started from ("raised from" / "during handling of")
        while (root.__cause__ or root.__context__) is not None and root is not (root.__cause__ or root.__context__):
            root = root.__cause__ or root.__context__
        last = f"{type(e).__name__}: {e}".strip().splitlines()
        return dict(ok=False, error=last[-1] if last else type(e).__name__, error_first_line=last[0] if last else "",
                    location=where(e), root_location=where(root) if root is not e else "",
                    root_error=f"{type(root).__name__}: {root}" if root is not e else "", traceback=tb)


def run_child(entry: dict, backend: str, timeout: int, kv: str = "fixed") -> dict:
    env = dict(os.environ)
    env.pop("WORKBENCH_CUDA_DOUBLE", None)
    if backend == "cuda-double":
        env["WORKBENCH_CUDA_DOUBLE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "tests"), env.get("PYTHONPATH", "")) if p)
    try:
        r = subprocess.run([sys.executable, __file__, "--child", backend, "--kv", kv], input=json.dumps(entry),
                           capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return dict(ok=False, error=f"TIMEOUT after {timeout} s", location="", timeout=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{\"")]
    if not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()
        return dict(ok=False, error=f"child exited {r.returncode}: {tail[-1] if tail else ''}", location="",
                    traceback=r.stderr[-4000:])
    return json.loads(lines[-1])


def cell(res: dict) -> str:
    if res.get("ok"):
        return "ok"
    if res.get("timeout"):
        return "TIMEOUT"
    if "error" in res:
        return "ERR"
    return f"DIFF@{res.get('first_diff')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default="/tmp/real_exports/manifest.json")
    ap.add_argument("--backend", choices=["cpu", "cuda-double", "cuda", "all"], default="all")
    ap.add_argument("--only", default=None, help="survey only exports whose name contains this")
    ap.add_argument("--json", default=None, help="also write every result (tracebacks included) to this file")
    ap.add_argument("--kv", choices=["fixed", "growing", "auto"], default="fixed", help="the Generator's KV mode")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per export and backend")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(decode_one(json.loads(sys.stdin.read()), args.child, args.kv)))
        return 0
    manifest = json.loads(Path(args.manifest).read_text())
    entries = [e for e in manifest if args.only is None or args.only in e["name"]]
    backends = ["cpu", "cuda-double"] if args.backend == "all" else [args.backend]
    results: dict[str, dict[str, dict]] = {}
    width = max([len(e["name"]) for e in entries] + [6])
    header = f"{'export':{width}s}  " + "  ".join(f"{b:11s}" for b in backends) + "  error (last line)"
    print(header)
    print("-" * len(header))
    for e in entries:
        row = results.setdefault(e["name"], {})
        for b in backends:
            row[b] = run_child(e, b, args.timeout, args.kv)
        errors = list(dict.fromkeys(row[b]["error"] for b in backends if "error" in row[b]))
        print(f"{e['name']:{width}s}  " + "  ".join(f"{cell(row[b]):11s}" for b in backends)
              + ("  " + " | ".join(errors) if errors else ""), flush=True)
    print()
    for name, row in results.items():
        for b, res in row.items():
            if res.get("ok"):
                continue
            if "error" in res:
                print(f"{name} [{b}]: {res['error']}")
                if res.get("error_first_line") and res["error_first_line"] != res["error"]:
                    print(f"    first line: {res['error_first_line']}")
                if res.get("location"):
                    print(f"    raised at {res['location']}")
                if res.get("root_location"):
                    print(f"    from {res['root_error'].splitlines()[0]}")
                    print(f"    at {res['root_location']}")
            else:
                want = next(e["ort_tokens"] for e in entries if e["name"] == name)
                print(f"{name} [{b}]: tokens differ from onnxruntime's at {res.get('first_diff')}: "
                      f"workbench {res.get('tokens')} vs onnxruntime {want}")
    ok = sum(r.get("ok", False) for row in results.values() for r in row.values())
    total = sum(len(row) for row in results.values())
    print(f"\n{ok}/{total} decodes token-exact against onnxruntime")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

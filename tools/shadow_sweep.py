"""Shadow-verify every built-in model under every combination of the six switches.

    python tools/shadow_sweep.py [--tokens N]

Each (model, switches, KV mode, greedy or speculative) decodes with
`shadow="raise"`: every step a mechanism served is re-run eagerly and compared
value by value. Prints one line per model and a total; exits 1 on any divergence
or any token that differs from the all-eager decode. The test suite runs a
pairwise subset of these combinations; this runs all 64.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from builtin_models import BUILT_IN, PROMPT  # noqa: E402

import workbench  # noqa: E402
from workbench import Generator, MechanismDivergenceError, SessionOptions  # noqa: E402

SWITCHES = ("capture", "decode_memo", "view_plan", "views", "compute_in_place", "release_dead_values")
REPEATING = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # prompt lookup finds drafts here


def decode(model, options, tokens, kv, speculative):
    session = workbench.InferenceSession(model, options=options)
    prompt = REPEATING if speculative else PROMPT
    result = Generator(session).generate(prompt, tokens, progress=False, eos_token_id=-1, kv=kv,
                                         speculative=speculative)
    return result.tokens, session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    failures = checked_steps = runs = 0
    t0 = time.perf_counter()
    for name, build in BUILT_IN.items():
        model = build().SerializeToString()
        model_failures = 0
        for kv, speculative in itertools.product(("growing", "fixed"), (0, 3)):
            eager = SessionOptions(capture=False, decode_memo=False, views=False, compute_in_place=False,
                                   view_plan=False, decode_memo_verify=False)
            reference, _ = decode(model, eager, args.tokens, kv, speculative)
            for values in itertools.product((False, True), repeat=len(SWITCHES)):
                combo = dict(zip(SWITCHES, values))
                options = SessionOptions(shadow="raise", decode_memo_verify=False, **combo)
                runs += 1
                try:
                    tokens, session = decode(model, options, args.tokens, kv, speculative)
                except MechanismDivergenceError as error:
                    print(f"DIVERGENCE {name} kv={kv} speculative={speculative} {combo}: {error}")
                    model_failures += 1
                    continue
                checked_steps += len(session.recording.shadow_checks())
                if tokens != reference:
                    print(f"TOKENS DIFFER {name} kv={kv} speculative={speculative} {combo}")
                    model_failures += 1
        failures += model_failures
        print(f"{name:18s} {model_failures} failing of {4 * 2 ** len(SWITCHES)} decodes")
    print(f"{runs} decodes, {checked_steps} shadow-checked steps, {failures} failures, "
          f"{time.perf_counter() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The shipped specs, generated from one table.

Every combination that the Python binding's constructors accept has a spec
(bindings/python/flashopt/optim.py `spec_name` gives the same names):

    rule  x  parameter mode  x  states  x  arithmetic  x  numerics

- rule: sgd, sgdw, adam, adamw, lion;
- parameter mode: bf16 and f16 with no correction, an i8 one (24-bit master
  weights, `_m24`) or an i16 one (32-bit, `_m32`); f32 (its own master);
- states: 8-bit (`quantized`), plain f32 (`_f32states`) or 4-bit
  (`quantized4`, `_4bit`: docs/NUMERICS.md §2e), the last only with bf16
  parameters and 24-bit master weights (exact and fast arithmetic) or f32
  parameters (exact), and the bounded numerics (the matrix stays lean:
  docs/design/4bit-states.md; the fast bf16 one is the 4-bit AdamW kernel
  within its GPU byte budget, docs/PERFORMANCE.md "4-bit states");
- arithmetic: exact, or the portable fast mode (`_fast`, docs/NUMERICS.md §7);
- numerics: bounded (the default) or FlashOptim's (`_flashoptim`,
  docs/NUMERICS.md §8), only where they differ — quantized states, or Adam's
  update bound — and only with exact arithmetic (FlashOptim has no fast mode).

    python3 specs/generate.py            # (re)writes specs/*.json
    python3 specs/generate.py --check    # fails if specs/ differs (a ctest)

Hand-written specs stay out of this folder (examples/custom-rules).
"""

import argparse
import json
import os
import sys

RULES = {  # name -> how descriptions call it
    "sgd": "SGD",
    "sgdw": "SGDW",
    "adam": "Adam",
    "adamw": "AdamW",
    "lion": "Lion",
}
# (suffix, dtype, correction, description of the parameter)
PARAMS = [
    ("bf16", "bf16", "none", "bf16 parameters without a correction term"),
    ("bf16_m24", "bf16", "i8", "bf16 parameters with an i8 correction term (24-bit master weights)"),
    ("bf16_m32", "bf16", "i16", "bf16 parameters with an i16 correction term (32-bit master weights)"),
    ("f16", "f16", "none", "f16 parameters without a correction term"),
    ("f16_m24", "f16", "i8", "f16 parameters with an i8 correction term (24-bit master weights)"),
    ("f16_m32", "f16", "i16", "f16 parameters with an i16 correction term (32-bit master weights)"),
    ("f32", "f32", "none", "f32 parameters"),
]
TARGETS = ["cpu", "sm_80", "sm_90", "sm_100"]
FAST = ("divisions by per-tensor and per-group values as reciprocal multiplies "
        "(docs/NUMERICS.md §7)")
FLASHOPTIM = ("FlashOptim's numerics: states rounded to nearest, no update bound, "
              "bit-identical to its kernels (docs/NUMERICS.md §8)")


def specs():
    """Every spec, in name order: name -> ordered dict."""
    out = {}
    for rule, title in RULES.items():
        for suffix, dtype, corr, pdesc in PARAMS:
            for states_form in ("quantized", "f32", "quantized4"):
                quantized = states_form != "f32"
                for fast in (False, True):
                    for flashoptim in (False, True):
                        if flashoptim and (fast or not (quantized or rule in ("adam", "adamw"))):
                            continue
                        if states_form == "quantized4" and (
                                flashoptim or suffix not in ("bf16_m24", "f32")
                                or (fast and suffix != "bf16_m24")):
                            continue
                        states_suffix = {"quantized": "", "f32": "_f32states",
                                         "quantized4": "_4bit"}[states_form]
                        name = (f"{rule}_{suffix}{states_suffix}"
                                f"{'_fast' if fast else ''}{'_flashoptim' if flashoptim else ''}")
                        grads = ("f32 parameters and gradients" if dtype == "f32"
                                 else f"{pdesc}, {dtype} gradients")
                        states = ("8-bit states" if states_form == "quantized" else
                                  "4-bit states (docs/NUMERICS.md §2e)"
                                  if states_form == "quantized4" else
                                  "plain f32 states (unquantized baseline"
                                  + ("; torch.optim's layout)" if dtype == "f32" else ")"))
                        head = title + (" in the portable fast mode" if fast else "")
                        desc = f"{head}: {grads}, {states}"
                        if fast:
                            desc += "; " + FAST
                        if flashoptim:
                            desc += "; " + FLASHOPTIM
                        spec = {"name": name, "description": desc, "rule": rule,
                                "param": {"dtype": dtype, "correction": corr},
                                "grad": dtype,
                                "states": states_form}
                        if fast:
                            spec["arithmetic"] = "fast"
                        if flashoptim:
                            spec["numerics"] = "flashoptim"
                        spec["targets"] = TARGETS
                        out[name] = spec
    return dict(sorted(out.items()))


def render(spec):
    """The file text: one member per line, objects and lists inline."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in spec.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with specs/ instead of writing; exit 1 on a difference")
    ap.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    want = {f"{n}.json": render(s) for n, s in specs().items()}
    have = {f for f in os.listdir(args.dir) if f.endswith(".json")}
    if args.check:
        bad = []
        for f in sorted(set(want) | have):
            path = os.path.join(args.dir, f)
            if f not in want:
                bad.append(f"{f}: not in the table (delete it, or add it to specs/generate.py)")
            elif f not in have:
                bad.append(f"{f}: missing (run python3 specs/generate.py)")
            elif open(path, encoding="utf-8").read() != want[f]:
                bad.append(f"{f}: differs from the table (run python3 specs/generate.py)")
        for b in bad:
            print("specs/" + b, file=sys.stderr)
        print(f"specs/generate.py --check: {len(want)} specs, {len(bad)} differences")
        return 1 if bad else 0
    for f in sorted(have - set(want)):
        os.remove(os.path.join(args.dir, f))
    for f, text in want.items():
        with open(os.path.join(args.dir, f), "w", encoding="utf-8") as out:
            out.write(text)
    print(f"specs/generate.py: wrote {len(want)} specs to {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

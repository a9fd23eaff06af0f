#!/usr/bin/env python3
"""A black-box probe of flashopt's input handling (ctest probe/inputs).

Mutates real inputs -- the shipped specs, the built-in and example rule files,
and checkpoints saved by a live optimizer -- the way careless or hostile users
do (truncation, flipped bytes, wrong types, duplicated keys, huge numbers,
deep nesting, FIFOs and devices where files belong, lying headers), feeds
each one to the tools and to the C ABI, and classifies the outcome. The
mutations know the file *formats* (JSON, MLIR text, safetensors), not the
parsers.

  crash    a signal, a sanitizer report, an LLVM fatal error or assertion
  hang     no answer within the timeout
  unclear  refused without saying where (specs and rules: file:line:col)
  silent   accepted although it cannot be right: a spec or rule whose output
           differs from the original's where the mutation made it invalid by
           construction, or a checkpoint accepted whose tensors are not what an
           independent safetensors reader reads from it (or that it cannot
           read), or a rejected checkpoint that changed the optimizer
  refused  refused clearly (the counted success for invalid input)
  accepted accepted and harmless (a mutation that left the input valid)

Usage: fuzz/probe-inputs.py [--build build] [--count N] [--seed S]
Prints one line per failure and a summary table; exits 1 on any failure.
"""

import argparse
import json
import os
import random
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRASH_MARKERS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:",
                 "LLVM ERROR", "Assertion", "PLEASE submit a bug report",
                 "Stack dump", "terminate called", "Segmentation fault")
LOC = re.compile(r"[^\s:]+:\d+:\d+: error")
FILE_ERR = re.compile(r"error: /[^\s:]+: ")


def run(cmd, timeout, stdin=None):
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=stdin)
    except subprocess.TimeoutExpired:
        return None, b"", b""
    return p.returncode, p.stdout, p.stderr


def classify_tool(rc, err):
    if rc is None:
        return "hang"
    text = err.decode("utf-8", "replace")
    if rc < 0 or rc >= 128 or any(m in text for m in CRASH_MARKERS):
        return "crash"
    # Clear: a file:line:col location, or (a whole-file error such as "no
    # optimizer in it") the file named.
    if rc != 0 and not (LOC.search(text) or FILE_ERR.search(text)):
        return "unclear"
    return "ok" if rc != 0 else "accepted"


# --------------------------------------------------------------------------
# Text mutations (specs and rule files)
# --------------------------------------------------------------------------

WEIRD_VALUES = ["null", "true", "[]", "{}", '""', "-1", "0", "1e400", "-1e400",
                "NaN", "Infinity", "18446744073709551617", "1e-46", '"\\u0000"',
                '"\\ud800"', '"' + "x" * 5000 + '"', "[[[[[[[[[[]]]]]]]]]]", "0.5",
                '"bf16"', '"i8"', '"softsign"', "3.4e38", "-0.0"]


def mutate_text(rng, text, kind):
    """Returns (mutated text, invalid_by_construction, description)."""
    choice = rng.randrange(12)
    if choice == 0 and len(text) > 2:
        cut = rng.randrange(1, len(text) - 1)
        # JSON cut inside: always invalid; MLIR cut: invalid unless at an op
        # boundary, which we cannot tell from outside.
        return text[:cut], kind == "spec", f"truncated at {cut}"
    if choice == 1:
        i = rng.randrange(len(text))
        b = bytearray(text.encode("utf-8", "surrogateescape"))
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        return b.decode("utf-8", "surrogateescape"), False, f"bit flip at byte {i}"
    if choice == 2:
        lines = text.split("\n")
        i = rng.randrange(len(lines))
        del lines[i]
        return "\n".join(lines), False, f"line {i + 1} deleted"
    if choice == 3:
        lines = text.split("\n")
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return "\n".join(lines), False, f"line {i + 1} duplicated"
    if choice == 4:
        depth = rng.choice([300, 5000, 20000])
        if kind == "spec":  # a new (unknown) key holding the nesting
            nest = "[" * depth + "]" * depth
            return (text.replace("{", '{"nest": ' + nest + ", ", 1), True,
                    f"key with {depth} nested [")
        at = rng.randrange(len(text))
        return (text[:at] + "(" * depth + ")" * depth + text[at:], False,
                f"{depth} nested ( at {at}")
    if choice == 5:
        # Replace one scalar value (a number or a string) by a weird one.
        matches = list(re.finditer(r'(?<=: )("[^"]*"|-?[0-9.eE+-]+)', text)) \
            if kind == "spec" else list(re.finditer(r"\b\d+\.\d+e[+-]\d+\b|\b(f32|f16|bf16|i8|i64)\b", text))
        if matches:
            m = rng.choice(matches)
            w = rng.choice(WEIRD_VALUES if kind == "spec" else
                           ["f64", "i1", "index", "1.0e+400", "0x7FC00000", "vector<4xf32>", "i8", "bf16"])
            return (text[:m.start()] + w + text[m.end():], False,
                    f"value {m.group(0)[:30]!r} -> {w[:30]!r}")
    if choice == 6:
        i = rng.randrange(len(text))
        junk = rng.choice(["\x00", "\xff", "\u202e", "}", "{", "%", "^bb0:", "\"", "\\", ",", "\t\t", "\r"])
        return text[:i] + junk + text[i:], False, f"insert {junk!r} at {i}"
    if choice == 7 and kind == "spec":
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and obj:
            key = rng.choice(list(obj))
            dup = text.rstrip().rstrip("}") + f', "{key}": {json.dumps(obj[key])}' + "}"
            return dup, True, f"duplicated key {key!r}"
    if choice == 8 and kind == "spec":
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and obj:
            key = rng.choice(list(obj))
            if key in ("name", "rule", "param"):  # required
                del obj[key]
                return json.dumps(obj, indent=2), True, f"required key {key!r} removed"
            obj["no_such_key_" + str(rng.randrange(100))] = 1
            return json.dumps(obj, indent=2), True, "unknown key added"
    if choice == 9:
        lines = text.split("\n")
        if len(lines) > 3:
            i, j = rng.sample(range(len(lines)), 2)
            lines[i], lines[j] = lines[j], lines[i]
            return "\n".join(lines), False, f"lines {i + 1} and {j + 1} swapped"
    if choice == 10:
        return text * 2, kind == "spec", "whole text twice"
    if choice == 11 and kind == "rule":
        # Rename an SSA value use to an undefined one, or a hyper to a clash.
        names = re.findall(r"%[a-z_0-9]+", text)
        if names:
            n = rng.choice(names)
            return text.replace(n, "%undefined_" + n[1:], 1), False, f"first {n} renamed"
    return text + "\n", False, "trailing newline (harmless)"


def probe_specs(args, rng, tmp, results):
    gen = str(Path(args.build) / "bin" / "flashopt-gen")
    seeds = sorted((ROOT / "specs").glob("*.json")) + sorted((ROOT / "examples" / "custom-rules").glob("*.json"))
    originals = {}
    for n in range(args.count):
        seed = rng.choice(seeds)
        text = seed.read_text()
        mutated, invalid, what = mutate_text(rng, text, "spec")
        # Rule files referenced relatively resolve against the spec's folder.
        path = tmp / seed.parent.name / f"m{n}-{seed.name}"
        path.parent.mkdir(exist_ok=True)
        for extra in seed.parent.glob("*.mlir"):
            shutil.copy(extra, path.parent / extra.name)
        path.write_text(mutated, errors="surrogateescape")
        rc, out, err = run([gen, str(path), "--emit=kernel-ir"], args.timeout)
        verdict = classify_tool(rc, err)
        if verdict == "accepted":
            if seed not in originals:
                _, originals[seed], _ = run([gen, str(seed), "--emit=kernel-ir"], args.timeout)
            # Accepted and invalid by construction: silent acceptance.
            verdict = "silent" if invalid else "accepted"
        results.append(("spec", f"{seed.name}: {what}", verdict, err))


def probe_rules(args, rng, tmp, results):
    gen = str(Path(args.build) / "bin" / "flashopt-gen")
    opt = str(Path(args.build) / "bin" / "flashopt-opt")
    seeds = sorted((ROOT / "lib" / "Rules").glob("*.mlir")) + sorted((ROOT / "examples" / "custom-rules").glob("*.mlir"))
    for n in range(args.count):
        seed = rng.choice(seeds)
        mutated, invalid, what = mutate_text(rng, seed.read_text(), "rule")
        path = tmp / f"r{n}-{seed.name}"
        path.write_text(mutated, errors="surrogateescape")
        verdicts = []
        for cmd in ([opt, str(path)], [gen, str(path), "--emit=llvm"],
                    [gen, str(path), "--emit=ptx"]):
            rc, out, err = run(cmd, args.timeout)
            v = classify_tool(rc, err)
            verdicts.append((v, err))
            if v != "accepted":
                break
        worst = next(((v, e) for v, e in verdicts if v in ("crash", "hang", "unclear")), None)
        if worst:
            results.append(("rule", f"{seed.name}: {what}", worst[0], worst[1]))
        else:
            accepted = all(v == "accepted" for v, _ in verdicts)
            results.append(("rule", f"{seed.name}: {what}",
                            ("silent" if invalid else "accepted") if accepted else "ok",
                            verdicts[-1][1]))


# --------------------------------------------------------------------------
# Checkpoints, through the C ABI (Python binding) and an independent reader
# --------------------------------------------------------------------------

def safetensors_read(path):
    """An independent reader (the safetensors package), or None if it refuses."""
    try:
        import torch
        from safetensors import safe_open
        out = {}
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k).contiguous()
                out[k] = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return out
    except Exception:  # noqa: BLE001 - any refusal
        return None


def raw_tensors(path):
    """Tensor bytes of a file flashopt wrote (trusted layout)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()}, meta


def mutate_checkpoint(rng, data):
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    choice = rng.randrange(12)

    def rebuild(h, b=body):
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + b

    if choice == 0:
        cut = rng.randrange(1, len(data))
        return data[:cut], f"truncated at {cut} of {len(data)}"
    if choice == 1:
        i = rng.randrange(8 + n, len(data))
        b = bytearray(data)
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b), f"data bit flip at byte {i}"
    if choice == 2:
        i = rng.randrange(8, 8 + n)
        b = bytearray(data)
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b), f"header bit flip at byte {i}"
    if choice == 3:
        big = rng.choice([n + 1, n - 1, 2 ** 40, 2 ** 64 - 1, 0, len(data)])
        return struct.pack("<Q", big) + data[8:], f"header length {n} -> {big}"
    k = rng.choice(names)
    if choice == 4:
        header[k]["dtype"] = rng.choice(["F16", "BF16", "F32", "I8", "U8", "F64", "I64", "XX", ""])
        return rebuild(header), f"{k}: dtype -> {header[k]['dtype']}"
    if choice == 5:
        shape = header[k]["shape"]
        header[k]["shape"] = rng.choice([[], [0], [-1], [2 ** 62, 4], shape + [1], [max(1, (shape or [1])[0] - 1)]])
        return rebuild(header), f"{k}: shape {shape} -> {header[k]['shape']}"
    if choice == 6:
        a, b = header[k]["data_offsets"]
        header[k]["data_offsets"] = rng.choice([[a, b + 1], [max(0, a - 1), b], [0, b - a], [b, a],
                                                [a, len(body) + 8], [-1, b], [a + 2 ** 63, b]])
        return rebuild(header), f"{k}: data_offsets [{a}, {b}] -> {header[k]['data_offsets']}"
    if choice == 7:
        meta = header.get("__metadata__", {})
        key = rng.choice(list(meta) or ["step"])
        meta[key] = rng.choice(["", "-1", "1e400", "{", "[]", "x" * 100000, "18446744073709551617",
                                json.dumps([{"name": "w", "numel": 1}]), "NaN"])
        header["__metadata__"] = meta
        return rebuild(header), f"__metadata__ {key!r} -> {meta[key][:40]!r}"
    if choice == 8 and len(names) > 1:
        k2 = rng.choice([x for x in names if x != k])
        header[k], header[k2] = header[k2], header[k]
        return rebuild(header), f"entries {k} and {k2} swapped"
    if choice == 9:
        del header[k]
        return rebuild(header), f"tensor {k} removed"
    if choice == 10:
        header["extra." + k] = dict(header[k])
        return rebuild(header), f"tensor {k} duplicated under another name"
    return data + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))), "garbage appended"


def probe_checkpoints(args, rng, tmp, results):
    sys.path.insert(0, str(ROOT / "bindings" / "python"))
    os.environ.setdefault("FLASHOPT_BUILD_DIR", str(Path(args.build).resolve()))
    import torch
    import flashopt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(37, 29), torch.nn.Linear(29, 3)).bfloat16()
    opt = flashopt.FlashAdamW(model.parameters(), lr=1e-2)
    x = torch.randn(8, 37).bfloat16()

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            model(x).float().pow(2).mean().backward()
            opt.step()

    train(3)
    good = tmp / "good.safetensors"
    opt.save_checkpoint(str(good))
    good_f32 = tmp / "good-f32.safetensors"
    opt.save_checkpoint(str(good_f32), compressed=False)
    train(2)  # the live state now differs from both files

    def snapshot():
        p = tmp / "snap.safetensors"
        opt.save_checkpoint(str(p))
        t, m = raw_tensors(p)
        return t, m.get("step"), [q.detach().clone() for q in model.parameters()]

    for n in range(args.count):
        src = rng.choice([good, good_f32])
        mutated, what = mutate_checkpoint(rng, src.read_bytes())
        path = tmp / f"c{n}.safetensors"
        path.write_bytes(mutated)
        before = snapshot()
        try:
            opt.load_checkpoint(str(path))
            loaded, error = True, ""
        except Exception as e:  # noqa: BLE001 - any refusal is an error here
            loaded, error = False, str(e)
        after = snapshot()
        label = f"{src.name}: {what}"
        if not loaded:
            unchanged = (before[0] == after[0] and before[1] == after[1]
                         and all(torch.equal(a, b) for a, b in zip(before[2], after[2])))
            clear = bool(error) and ("'" in error or '"' in error or "tensor" in error
                                     or "header" in error or "metadata" in error or "file" in error)
            results.append(("checkpoint", label, "ok" if unchanged and clear else
                            ("silent" if not unchanged else "unclear"), error.encode()))
            continue
        # Accepted: what it loaded must be what an independent reader reads.
        independent = safetensors_read(path)
        if independent is None:
            results.append(("checkpoint", label, "silent",
                            b"accepted, but the safetensors package refuses the file"))
            continue
        if src == good:
            same = all(after[0].get(k) == v for k, v in independent.items() if k in after[0])
            same = same and set(independent) == set(after[0])
        else:  # an F32 file is converted on load: compare with the pristine load
            opt.load_checkpoint(str(src))
            ref = snapshot()
            same = ref[0] == after[0]
        # A flipped bit or a cut anywhere makes a file wrong by construction:
        # the per-tensor and metadata checksums must catch what the layout
        # checks do not.
        corrupt = what.startswith(("data bit flip", "header bit flip", "truncated"))
        verdict = "accepted" if same and not corrupt else "silent"
        results.append(("checkpoint", label, verdict,
                        b"" if verdict == "accepted" else
                        b"accepted with different tensors" if not same else
                        b"accepted a corrupted file"))
        opt.load_checkpoint(str(good))
        train(2)

    # Not a regular file, where a checkpoint belongs.
    fifo = tmp / "fifo.safetensors"
    os.mkfifo(fifo)
    specials = [fifo, Path("/dev/zero"), Path("/dev/null"), tmp]
    link = tmp / "link.safetensors"
    link.symlink_to("/dev/zero")
    specials.append(link)
    for p in specials:
        before = snapshot()
        import threading
        outcome = {}

        def attempt():
            try:
                opt.load_checkpoint(str(p))
                outcome["r"] = "accepted"
            except Exception as e:  # noqa: BLE001
                outcome["r"] = "ok" if str(e) else "unclear"
        t = threading.Thread(target=attempt, daemon=True)
        t.start()
        t.join(args.timeout)
        verdict = outcome.get("r", "hang")
        if verdict == "accepted":
            verdict = "silent"
        if verdict == "ok" and snapshot()[0] != before[0]:
            verdict = "silent"
        results.append(("checkpoint", f"load from {p} ({'link' if p.is_symlink() else 'special'})",
                        verdict, b""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--count", type=int, default=200, help="mutants per kind")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--only", choices=["spec", "rule", "checkpoint"])
    ap.add_argument("--show-accepted", action="store_true",
                    help="also list the mutants that were accepted (to review them)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="flashopt-probe-") as d:
        tmp = Path(d)
        for kind, fn in (("spec", probe_specs), ("rule", probe_rules), ("checkpoint", probe_checkpoints)):
            if args.only in (None, kind):
                fn(args, random.Random(rng.random()), tmp, results)
    bad = [r for r in results if r[2] not in ("ok", "accepted")]
    if args.show_accepted:
        for kind, label, verdict, err in results:
            if verdict == "accepted":
                print(f"ACCEPTED {kind:10} {label}")
    for kind, label, verdict, err in bad:
        first = err.decode("utf-8", "replace").strip().split("\n")[0][:200]
        print(f"{verdict.upper():8} {kind:10} {label}\n         {first}")
    kinds = sorted({r[0] for r in results})
    print(f"\n{'kind':12}{'inputs':>8}{'refused':>9}{'accepted':>10}{'crash':>7}{'hang':>6}"
          f"{'unclear':>9}{'silent':>8}")
    for k in kinds:
        rs = [r for r in results if r[0] == k]
        count = lambda v: sum(1 for r in rs if r[2] == v)  # noqa: E731
        print(f"{k:12}{len(rs):>8}{count('ok'):>9}{count('accepted'):>10}{count('crash'):>7}{count('hang'):>6}"
              f"{count('unclear'):>9}{count('silent'):>8}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

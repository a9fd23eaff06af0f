"""The demo (examples/python/digits.py, scripts/run-demo.sh): FlashAdamW on a
bf16 CNN ends no worse than torch AdamW (fp32) by more than 1 % in final test
accuracy (points) and test loss on scikit-learn's digits, 300 steps from the
same initialization.

A single run's final test loss moves by several percent with the seed for
either optimizer (the late, overfitting phase is chaotic: per-seed gaps seen
were -2 %..+1.4 %), so the comparison is over the mean of three seeds (data
split, initialization and batch order), the same seeds for both.

The claim is "no loss of quality", so the test is one-sided: being better
than torch is not a failure. A two-sided 1 % failed on every run on an AMD
EPYC host, where torch's own CPU kernels give other bits (flashopt's mean
test loss 0.1167 against torch's 0.1183, 1.3 % better), so it depended on
the host; a one-sided bound does not."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "python"))

pytest.importorskip("sklearn")
import digits  # noqa: E402


def test_flash_adamw_matches_torch_adamw_on_digits(tmp_path):
    runs = [digits.train(300, seed=s, progress=False, workdir=str(tmp_path)) for s in (0, 1, 2)]

    def mean(k, m):
        return sum(r["final"][k][m] for r in runs) / len(runs)
    f, t = mean("flashopt", "test_loss"), mean("torch", "test_loss")
    assert f <= 1.01 * t, ("test_loss", f, t)
    f, t = mean("flashopt", "test_acc"), mean("torch", "test_acc")
    assert f >= t - 0.01, ("test_acc", f, t)
    # It learned: well above chance (10 %).
    assert mean("flashopt", "test_acc") > 0.9
    r = runs[0]
    # 24-bit master weights and 8-bit states: 7.125 B/param with gradients.
    m = r["memory"]["flashopt"]
    assert sum(m.values()) == pytest.approx(7.125, abs=0.01)
    assert sum(r["memory"]["torch"].values()) == pytest.approx(16.0)
    assert r["checkpoint"]["flashopt"] < r["checkpoint"]["torch"] / 2


def test_flash_adamw_4bit_states_match_torch_adamw_on_digits(tmp_path):
    """The same bar with 4-bit states (state_bits=4, docs/NUMERICS.md §2e):
    6.125 B/param, no worse than torch's fp32 AdamW by more than 1 %."""
    runs = [digits.train(300, seed=s, progress=False, workdir=str(tmp_path), state_bits=4)
            for s in (0, 1, 2)]

    def mean(k, m):
        return sum(r["final"][k][m] for r in runs) / len(runs)
    f, t = mean("flashopt", "test_loss"), mean("torch", "test_loss")
    print(f"digits, 4-bit states, mean of 3 seeds: test loss {f:.4f} vs torch {t:.4f}")
    assert f <= 1.01 * t, ("test_loss", f, t)
    f, t = mean("flashopt", "test_acc"), mean("torch", "test_acc")
    assert f >= t - 0.01, ("test_acc", f, t)
    m = runs[0]["memory"]["flashopt"]
    assert sum(m.values()) == pytest.approx(6.125, abs=0.01)

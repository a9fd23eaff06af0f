"""The hazards of 8-bit states measured on the shipped kernels (through the
binding), in the bounded numerics and in FlashOptim's: the kernel half of the
table in docs/NUMERICS.md §8. The scenarios are those of
bindings/python/tests/test_state_hazards.py (which asserts the bounds).

    FLASHOPT_LIBRARY=build/lib/libflashopt.so FLASHOPT_KERNELS=build/kernels \\
      PYTHONPATH=bindings/python .venv/bin/python bench/state_hazards/kernels.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bindings/python/tests"))
import flashopt  # noqa: E402
import test_state_hazards as T  # noqa: E402


def main():
    ref = T.first_layer_move(lambda p: torch.optim.AdamW(p, lr=1e-3))
    print(f"rare-input MLP, AdamW lr 1e-3, 400 steps: largest |dW1| (torch fp32 {ref:.3g})")
    for name, kw in [("fp32 states", dict(quantize=False)),
                     ("bounded, exact", {}), ("bounded, fast", dict(arithmetic="fast")),
                     ("flashoptim", dict(numerics="flashoptim"))]:
        w = T.first_layer_move(lambda p: flashopt.FlashAdamW(p, lr=1e-3, **kw))
        print(f"  {name:16s} {w:10.4g}  ({w / ref:.3g}x)", flush=True)
    print("weights whose gradient stops, cumulative move over 1000 steps / fp32's")
    for rule, factory in (("adam", T.ADAM), ("sgd", T.SGD)):
        for numerics in ("bounded", "flashoptim"):
            mine, r = T.stopped_moves(factory(numerics=numerics))
            ratio = mine / r.clamp_min(1e-30)
            print(f"  {rule:5s} {numerics:10s} median {ratio.median():8.3g}  max {ratio.max():8.3g}",
                  flush=True)


if __name__ == "__main__":
    main()

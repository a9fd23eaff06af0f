"""The self-contained wheel (pyproject.toml at the repository root): built
with pip from an existing build (FLASHOPT_WHEEL_PREBUILT, so nothing is
compiled again), installed into a fresh virtual environment, and used to
train outside the source tree with no flashopt environment variable.

The fresh environment sees torch through a .pth file naming the shared
environment's site-packages (a venv made from a venv with
--system-site-packages sees the system's packages, not the shared ones), so
nothing is downloaded: pip installs with --no-index and finds torch,
safetensors and numpy installed. Slow (~1 min): ctest runs it as
python.test_wheel with its own timeout; it prints the wheel's size and the
build and install times."""

import os
import subprocess
import sys
import sysconfig
import textwrap
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUILD = Path(os.environ.get("FLASHOPT_TEST_BUILD_DIR", ROOT / "build"))

TRAIN = textwrap.dedent("""
    import os, sys, torch, flashopt
    here = os.path.dirname(flashopt.__file__)
    assert here.startswith(sys.prefix), (here, sys.prefix)
    assert flashopt.library_path().startswith(here), flashopt.library_path()
    assert str(flashopt.kernels_dir()).startswith(here), flashopt.kernels_dir()
    torch.manual_seed(0)
    model = flashopt.cast_model(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)))
    opt = flashopt.FlashAdamW(model.parameters(), lr=1e-2)
    x = torch.randn(64, 16).bfloat16()
    y = (x.float() @ torch.randn(16, 4)).argmax(1)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    opt.save_checkpoint("ckpt.safetensors")
    print("trained", sorted(opt.specs()), losses[0], losses[-1])
""")


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FLASHOPT_") and k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_NO_INDEX"] = "1"
    env.pop("PIP_FIND_LINKS", None)
    return env


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_wheel_installs_and_trains_outside_the_tree(tmp_path):
    assert (BUILD / "lib" / "libflashopt.so").exists(), f"build {BUILD} first"
    t0 = time.perf_counter()
    run([sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "--no-build-isolation",
         "-w", tmp_path / "dist",
         f"--config-settings=cmake.define.FLASHOPT_WHEEL_PREBUILT={BUILD}",
         f"--config-settings=build-dir={tmp_path / 'skbuild'}"], env=clean_env())
    built = time.perf_counter() - t0
    (whl,) = (tmp_path / "dist").glob("flashopt-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "flashopt/lib/libflashopt.so" in names
    assert "flashopt/kernels/adamw_bf16_m24/manifest.json" in names
    assert "flashopt/_lib.py" in names

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(site.stdout.strip()) / "shared-venv.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    t0 = time.perf_counter()
    run([sys.executable, "-m", "pip", "--python", py, "install", "--no-index", whl],
        env=clean_env())
    installed = time.perf_counter() - t0

    work = tmp_path / "elsewhere"
    work.mkdir()
    out = run([py, "-c", TRAIN], cwd=work, env=clean_env())
    assert "trained ['adamw_bf16_m24', 'adamw_f32']" in out.stdout
    assert (work / "ckpt.safetensors").is_file()
    print(f"wheel {whl.name}: {whl.stat().st_size / 1e6:.1f} MB, "
          f"{sum(i.file_size for i in zipfile.ZipFile(whl).infolist()) / 1e6:.1f} MB "
          f"installed; pip wheel (prebuilt) {built:.1f} s, pip install {installed:.1f} s")

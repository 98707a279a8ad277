"""Checks the torch modules `cargo xtask convert MODEL.keras --to torch` writes, with the real torch.

For every model with a Keras probe in datasets/keras-models/ (or the .keras files given): converts
it into a temporary folder, loads the generated module with `load_state_dict(strict=True)` and
compares its outputs with Burn's (the probe written beside it) and with Keras' (the model's own
probe, made by keras 3.15.1), at 1e-5. Exit status 1 if any model fails. Run from the repository
root after `cargo build`:

    python3 xtask/python/check_torch_models.py [MODEL.keras ...]
"""

import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
XTASK = os.path.join(ROOT, "target", "debug", "xtask")


def main():
    models = sys.argv[1:] or sorted(
        p[: -len(".probe.safetensors")] + ".keras" for p in glob.glob(os.path.join(ROOT, "datasets/keras-models/*.probe.safetensors"))
    )
    failed = []
    with tempfile.TemporaryDirectory() as out:
        for model in models:
            stem = os.path.splitext(os.path.basename(model))[0]
            target = os.path.join(out, stem)
            converted = subprocess.run([XTASK, "convert", model, "--to", "torch", "--out", target], capture_output=True, text=True)
            if converted.returncode != 0:
                failed.append(f"{stem}: convert failed: {converted.stderr.strip()}")
                continue
            probes = [("burn", []), ("keras", ["--probe", model[: -len(".keras")] + ".probe.safetensors"])]
            for source, extra in probes:
                if source == "keras" and not os.path.exists(extra[1]):
                    continue
                run = subprocess.run([sys.executable, target + ".py", *extra], capture_output=True, text=True)
                lines = run.stdout.strip().splitlines()
                print(f"{stem} vs {source}: " + "; ".join(lines) if lines else f"{stem} vs {source}: {run.stderr.strip()[-300:]}")
                if run.returncode != 0:
                    failed.append(f"{stem} vs {source}")
    print(f"{len(models) * 2 - len(failed)} checks passed, {len(failed)} failed")
    for f in failed:
        print("FAILED:", f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

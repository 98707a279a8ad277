"""Checks the torch modules `cargo xtask convert MODEL.keras --to torch` writes, with the real torch.

For every model with a Keras probe in datasets/keras-models/, keras-io/ and keras-hub/ (or the
.keras files given): converts it into a temporary folder, loads the generated module with
`load_state_dict(strict=True)` and compares its outputs with Burn's (the probe written beside
it) and with Keras' (the model's own probe, made by keras 3.15.1), at 1e-5; where the model has
`<stem>.stats.safetensors` (the law of Keras' dropout in training), the module in training mode
must have its moments too. The keras.io examples in datasets/keras-io/ go through `cargo xtask
flatten` first where they have classes of their own (with their probe's flatten options), and
KerasHub's models with `hub.py`, then the same checks; an example whose custom layer the
flattener keeps is skipped. Exit status 1 if any model fails. Run from the repository
root after `cargo build`:

    python3 xtask/python/check_torch_models.py [MODEL.keras ...]
"""

import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
XTASK = os.path.join(ROOT, "target", "debug", "xtask")


def main():
    models = sys.argv[1:] or sorted(
        p[: -len(".probe.safetensors")] + ".keras"
        for folder in ("keras-models", "keras-io", "keras-hub")
        for p in glob.glob(os.path.join(ROOT, "datasets", folder, "*.probe.safetensors"))
    )
    failed, checks, law_module = [], 0, None
    with tempfile.TemporaryDirectory() as out:
        for model in models:
            stem = os.path.splitext(os.path.basename(model))[0]
            target = os.path.join(out, stem)
            source, reason = flattened(model, out)
            if source is None:
                print(f"{stem}: skipped ({reason})")
                continue
            checks += 2
            converted = subprocess.run([XTASK, "convert", source, "--to", "torch", "--out", target], capture_output=True, text=True)
            if converted.returncode != 0:
                failed.append(f"{stem}: convert failed: {converted.stderr.strip()}")
                continue
            with open(target + ".py") as f:
                if "def keras_dropout(" in f.read():  # a module carries the prelude's code it calls
                    law_module = target + ".py"
            probes = [("burn", []), ("keras", ["--probe", model[: -len(".keras")] + ".probe.safetensors"])]
            for source, extra in probes:
                if source == "keras" and not os.path.exists(extra[1]):
                    continue
                run = subprocess.run([sys.executable, target + ".py", *extra], capture_output=True, text=True)
                lines = run.stdout.strip().splitlines()
                print(f"{stem} vs {source}: " + "; ".join(lines) if lines else f"{stem} vs {source}: {run.stderr.strip()[-300:]}")
                if run.returncode != 0:
                    failed.append(f"{stem} vs {source}")
            stats = model[: -len(".keras")] + ".stats.safetensors"
            if os.path.exists(stats):
                checks += 1
                worst = dropout_moments(target + ".py", stats)
                print(f"{stem} in training vs Keras' dropout: {worst}")
                if worst is None or worst[0] > 5.0 or worst[1] > 0.08:
                    failed.append(f"{stem} dropout moments")
        if law_module is None and sys.argv[1:]:
            print("keras_dropout's law: not checked (no module given carries keras_dropout)")
        elif law_module is None:  # the committed models have dropout: the law must be checked
            checks += 1
            failed.append("keras_dropout's law: no converted module carries keras_dropout")
        else:
            checks += 1
            law = dropout_law(law_module)
            print(f"keras_dropout's law: {law}")
            if law[0] > 5.0 or law[1] > 5.0 or law[2] > 1e-6:
                failed.append("keras_dropout's law")
    print(f"{checks - len(failed)} checks passed, {len(failed)} failed")
    for f in failed:
        print("FAILED:", f)
    sys.exit(1 if failed else 0)


def flattened(model, out):
    """`(path, None)`: the file to convert, `model` itself or, for a keras.io example with classes
    of its own, its flattening by `cargo xtask flatten` (the probe's options); `(None, reason)` for
    one whose custom layer the flattener keeps (as its probe says) or whose flattening fails."""
    from safetensors import safe_open

    with safe_open(model[: -len(".keras")] + ".probe.safetensors", "np") as probe:
        metadata = probe.metadata() or {}
    hub = os.path.basename(os.path.dirname(os.path.abspath(model))) == "keras-hub"
    if not metadata.get("custom_classes") and not hub:
        return model, None
    if metadata.get("kept"):
        return None, "the flattener keeps " + metadata["kept"]
    flat = os.path.join(out, os.path.basename(model)[: -len(".keras")] + ".flat.keras")
    # A keras.io example's classes are in the file beside it; KerasHub's registers with Keras on import.
    source = os.path.join(os.path.dirname(model), "hub.py") if hub else model[: -len(".keras")] + ".py"
    options = json.loads(metadata.get("flatten", "[]"))
    run = subprocess.run([XTASK, "flatten", model, "--import", source, "--out", flat, *options], capture_output=True, text=True)
    if run.returncode != 0:
        return None, "flatten failed: " + run.stderr.strip()[-300:]
    return flat, None


def dropout_law(module_path, n=4_000_000, rate=0.3):
    """A module's `keras_dropout` (the last checked that has one) on n ones: how far the dropped fraction is from `rate` and the
    fraction of neighbours both dropped from rate^2 (the two halves of one 64-bit draw must be
    independent), in standard errors, and the largest relative error of a kept value from 1 / (1 - rate)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("converted", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    out = module.keras_dropout(torch.ones(n), rate)
    dropped = out == 0
    fraction = dropped.double().mean().item()
    pairs = (dropped[0::2] & dropped[1::2]).double().mean().item()
    kept_error = (out[~dropped].double() * (1 - rate) - 1).abs().max().item()
    return (abs(fraction - rate) / (rate * (1 - rate) / n) ** 0.5,
            abs(pairs - rate**2) / (rate**2 * (1 - rate**2) / (n // 2)) ** 0.5,
            kept_error)


def dropout_moments(module_path, stats_path, draws=20000):
    """The generated module in training mode on the stats' input tiled `draws` times: the worst
    difference of each output element's mean from Keras' (in standard errors) and of its standard
    deviation (relative, or against 0.0625 where smaller), as crates/keras/tests/recurrent_dropout.rs
    checks Burn."""
    import importlib.util

    import numpy as np
    import torch
    from safetensors.numpy import load_file

    spec = importlib.util.spec_from_file_location("converted", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.load().train()
    stats = load_file(stats_path)
    x = torch.tensor(stats["inputs.series"])
    torch.manual_seed(0)
    with torch.no_grad():
        outputs = model(x.repeat(draws, 1, 1))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    names = sorted({k.split(".", 1)[1] for k in stats if k.startswith("mean.")}, key=list(module.OUTPUTS).index)
    worst = (0.0, 0.0)
    for name, out in zip(names, outputs):
        o = out.double().reshape(draws, *x.shape[:2], -1)
        mean, std = o.mean(0).numpy(), o.std(0, unbiased=False).numpy()
        keras_mean, keras_std = stats["mean." + name], stats["std." + name]
        se = np.sqrt(keras_std.astype(np.float64) ** 2 / 20000 + std**2 / draws)
        worst = (max(worst[0], float(np.max(np.abs(mean - keras_mean) / np.maximum(se, 1e-6)))),
                 max(worst[1], float(np.max(np.abs(std - keras_std) / np.maximum(keras_std, 0.0625)))))
    return worst


if __name__ == "__main__":
    main()

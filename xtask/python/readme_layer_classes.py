"""Rewrites README's list of layer classes from the `registry!` in crates/keras/src/layers/mod.rs.

The test `layers::registry::tests::readme_lists_the_registry` fails when the two differ; run this
from the repository root to bring README in line:

    python3 xtask/python/readme_layer_classes.py
"""

import os
import re
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTRO = "Layer classes (the `registry!`"


def registry_classes():
    source = open(os.path.join(ROOT, "crates/keras/src/layers/mod.rs")).read()
    block = source[source.index("registry! {"):]
    block = block[: block.index("\n}")]
    return re.findall(r"\"([^\"]+)\"", block)


def wrapped(text, width=100):
    lines, current = [], ""
    for word in text.split(" "):
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return lines + [current]


def main():
    path = os.path.join(ROOT, "README.md")
    lines = open(path).read().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(INTRO)) + 1
    end = start
    while lines[end].strip():
        end += 1
    listing = ", ".join(f"`{c}`" for c in registry_classes()) + "."
    lines[start:end] = wrapped(listing)
    with tempfile.NamedTemporaryFile("w", dir=ROOT, delete=False) as out:
        out.write("\n".join(lines))
    os.chmod(out.name, os.stat(path).st_mode)
    os.replace(out.name, path)
    print(f"README lists {len(registry_classes())} layer classes")


if __name__ == "__main__":
    main()

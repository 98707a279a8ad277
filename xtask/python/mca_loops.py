#!/usr/bin/env python3
"""The attention kernel's inner loops under llvm-mca's models of other processors.

Compiles the `kernels` crate as the workspace compiles it (the dev profile builds it at
opt-level 3) with `--emit asm` and readable (v0) symbols, finds the innermost loops of each tile
function (`forward_tile::<T>`, `key_value_tile::<T>`, `query_tile::<T>`, for AVX-512 and AVX2,
one tile or two walked together), keeps the loops of the tile products (the dot products and
the weighted sums), of the softmax's exponentials (its loop without mask or dropout) and, for
heads of 4 features, of the exponentials with their weighted sum (the bounded loop) and runs
`llvm-mca` on each for every `--mcpu`, printing one Markdown table: cycles per iteration,
multiply-adds per cycle, and the busiest execution port with its cycles per iteration.

    python3 xtask/python/mca_loops.py [--mcpu znver4 --mcpu sapphirerapids ...] [--asm FILE.s]

Needs `llvm-mca-19` and `llvm-cxxfilt-19` (Debian's `llvm-19`; LLVM 14 has no model of
Sapphire Rapids or Zen 4). Note what the models are: LLVM 19's `sapphirerapids` (and
`icelake-server`, `graniterapids`) schedule every 512-bit FMA on port 0 alone, as on the client
cores they were measured on, so they cannot show a server core's second FMA unit on port 5;
`skylake-avx512` is LLVM's model with both, and stands in for it (docs/benchmarks.md).
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

LLVM_MCA = os.environ.get("LLVM_MCA", "llvm-mca-19")
CXXFILT = os.environ.get("LLVM_CXXFILT", "llvm-cxxfilt-19")
FUNCTIONS = re.compile(r"kernels::attention::compiled::(avx512|avx2)::(forward_tile|key_value_tile|query_tile)::<(\d)>")


def emit_asm(root):
    """The kernels crate's assembly, as the dev profile builds it, with v0 symbols."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    cmd = ["cargo", "rustc", "-p", "kernels", "--lib", "--locked", "--", "--emit", "asm",
           "-C", "symbol-mangling-version=v0"]
    subprocess.run(cmd, cwd=root, check=True)
    files = sorted(glob.glob(os.path.join(target, "debug", "deps", "kernels-*.s")), key=os.path.getmtime)
    if not files:
        sys.exit(f"no kernels-*.s under {target}/debug/deps after {' '.join(cmd)}")
    return files[-1]


def functions(path):
    """{demangled tile function: its lines} for the functions FUNCTIONS matches."""
    lines = open(path).read().splitlines()
    starts = [(i, line[:-1]) for i, line in enumerate(lines) if re.match(r"^_R\S*:$", line)]
    names = subprocess.run([CXXFILT], input="\n".join(name for _, name in starts), text=True,
                           capture_output=True, check=True).stdout.splitlines()
    found = {}
    for (i, _), name in zip(starts, names):
        match = FUNCTIONS.search(name)
        if not match:
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(".cfi_endproc")), len(lines))
        found[(match.group(1), match.group(2), int(match.group(3)))] = lines[i:end]
    return found


def loops(body):
    """The innermost loops of one function: blocks that branch back to their own label with no
    other label inside."""
    found = []
    for i, line in enumerate(body):
        label = re.match(r"^(\.LBB\S+):", line)
        if not label:
            continue
        for j in range(i + 1, len(body)):
            text = body[j].strip()
            if re.match(r"^\.LBB\S+:", body[j]):
                break
            if re.match(rf"^j\w+\s+{re.escape(label.group(1))}$", text):
                found.append([b.strip() for b in body[i + 1:j + 1] if b.strip() and not b.strip().startswith((".", "#"))])
                break
    return found


def kind(loop):
    """What a loop computes, from its instructions; None for loops that do no float work."""
    fmas = [i for i in loop if i.startswith("vfmadd")]
    # The softmax's exponentials: AVX-512 scales by 2^floor(t) with vscalefps, the generic exp
    # builds 2^n in the exponent bits (a shift by 23), AVX2's takes 2^(j/8) from a register
    # (vpermps) and adds n << 20.
    scales = ("vscalefps", "vpermps")
    # Elements of a row broadcast from memory (constants come from the code's own data, %rip).
    broadcasts = [i for i in loop if ("{1to16}" in i or i.startswith("vbroadcastss")) and "(%rip)" not in i]
    if len(fmas) >= 4 and any(i.startswith(scales) or re.match(r"vpslld\s+\$(23|20)", i) for i in loop):
        # Heads of 4 features take each exponential's weighted sum in the same loop.
        return "exponentials and weighted sum" if broadcasts else "exponentials"
    if len(fmas) < 4 or not broadcasts:
        return None
    # A weighted sum broadcasts consecutive elements of one row (one base, displacements 4
    # apart); the dot products broadcast one element of each of several rows.
    bases = {re.sub(r"^-?(0x)?[0-9a-f]*\(", "(", re.search(r"-?(0x)?[0-9a-f]*\([^)]*\)", i).group(0))
             for i in broadcasts if "(" in i}
    return "weighted sum" if len(bases) == 1 and len(broadcasts) > 1 else "dot products"


def mca(loop, mcpu):
    """(cycles per iteration, busiest resource and its cycles per iteration) under `mcpu`."""
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write(".LOOP:\n" + "\n".join(re.sub(r"^(j\w+)\s+\.LBB\S+$", r"\1 .LOOP", i) for i in loop) + "\n")
    out = subprocess.run([LLVM_MCA, f"-mcpu={mcpu}", "-iterations=200", "-resource-pressure", f.name],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / 200
    names = dict(re.findall(r"^\[(\d+(?:\.\d+)?)\]\s+-\s+(\S+)", out, re.M))
    header, values = re.search(r"Resource pressure per iteration:\n(.*)\n(.*)\n", out).groups()
    columns = re.findall(r"\[([\d.]+)\]", header)
    pressures = [(float(v) if v != "-" else 0.0, names.get(c, c)) for c, v in zip(columns, values.split())]
    busiest = max(pressures)
    return cycles, busiest


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mcpu", action="append", help="llvm-mca processor models (repeatable)")
    parser.add_argument("--asm", help="an assembly file already emitted (skips the build)")
    args = parser.parse_args()
    mcpus = args.mcpu or ["znver4", "sapphirerapids", "skylake-avx512"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    asm = args.asm or emit_asm(root)
    rows = []
    for (isa, function, tiles), body in sorted(functions(asm).items(), key=lambda item: (item[0][0] != "avx512", item[0])):
        # Of each kind of loop, the one with the most multiply-adds: the full group of rows or
        # features (the others are the remainders of a length that is no multiple of it).
        # Of the exponentials' loops (with and without mask or dropout, the same multiply-adds),
        # the shortest: the one without mask or dropout (and for heads of 4 features, whose
        # exponentials take their weighted sum in the same loop, the bounded one: no clamp).
        widest = {}
        for loop in loops(body):
            what = kind(loop)
            exponentials = what is not None and what.startswith("exponentials")
            rank = (sum(i.startswith("vfmadd") for i in loop), -len(loop) if exponentials else 0)
            if what is not None and rank > widest.get(what, ((0, 0), None))[0]:
                widest[what] = (rank, loop)
        for what in ["dot products", "exponentials", "weighted sum", "exponentials and weighted sum"]:
            if what in widest:
                (fmas, _), loop = widest[what]
                rows.append((isa, function, tiles, what, fmas, len(loop), [mca(loop, m) for m in mcpus]))
    head = "| isa | function | tiles | loop | FMAs | instructions | " + " | ".join(
        f"{m}: cycles, FMA/cycle, busiest" for m in mcpus) + " |"
    print(head)
    print("|" + "---|" * (6 + len(mcpus)))
    for isa, function, tiles, what, fmas, n, results in rows:
        cells = [f"{c:.2f}, {fmas / c:.2f}, {name} {load:.2f}" for c, (load, name) in results]
        print(f"| {isa} | {function} | {tiles} | {what} | {fmas} | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The benchmark of one machine in one command, in one folder named by its processor: the sweep
# with --profile (where ours spends its time) on the widest instruction set and again with
# --isa avx2, each beside torch and TensorFlow in turns on the same threads, plus lscpu. The
# tables of each run (ours / the fastest reference, the profile, the attention kernel's choice of
# tiles walked together per class of calls) are gathered into report.md.
#
#   bash xtask/machine-bench.sh [OUT_ROOT [BENCH_FLAGS...]]   # default reports/bench/machines
#   bash xtask/machine-bench.sh reports/bench/machines --shape 32,136,4,6,4 --shape 8,512,256,8,32
#
# Without --shape flags it runs the eight shapes of docs/benchmarks.md. XTASK names the xtask
# binary (default target/debug/xtask, built by `cargo build --bin xtask`), BENCH_PYTHON the Python
# with torch (and tensorflow). REPORT_ONLY=1 skips the runs and writes report.md from the folder's
# widest.log and avx2.log (COMMIT names the commit they were measured at). On a machine with many cores, xtask/pairs-bench.sh runs the same
# sweep as eight jobs at once instead.
set -uo pipefail
cd "$(dirname "$0")/.."
root=${1:-reports/bench/machines}
shift || true
extra=("$@")
xtask=${XTASK:-target/debug/xtask}
python=${BENCH_PYTHON:-python3}
[ -x "$xtask" ] || [ "${REPORT_ONLY:-0}" = 1 ] || { echo "no xtask binary at $xtask (cargo build --bin xtask, or set XTASK)" >&2; exit 1; }

model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
family=$(lscpu | sed -n 's/^CPU family: *//p' | head -1)
number=$(lscpu | sed -n 's/^Model: *//p' | head -1)
slug=$(printf '%s family %s model %s' "$model" "$family" "$number" | tr '[:upper:]' '[:lower:]' |
    sed 's/([^)]*)//g; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
out="$root/$slug"
mkdir -p "$out"
lscpu > "$out/lscpu.txt"

shapes=()
if ! printf '%s\n' "${extra[@]}" | grep -qx -- --shape; then
    for shape in 32,136,4,6,4 8,512,256,8,32 4,1024,512,8,64 1,4096,64,4,16 4,512,768,12,64 \
        2,1024,1024,8,128 8,256,512,16,32 3,300,96,6,16; do
        shapes+=(--shape "$shape")
    done
fi

status=0
for isa in widest avx2; do
    [ "${REPORT_ONLY:-0}" = 1 ] && break
    flags=()
    [ "$isa" = avx2 ] && flags=(--isa avx2)
    echo "== $model: $isa (log in $out/$isa.log)"
    "$xtask" bench --no-scaling --profile --python "$python" "${shapes[@]}" "${flags[@]}" "${extra[@]}" \
        --json "$out/$isa.json" > "$out/$isa.log" 2>&1 || status=1
    grep -E "^processor|FMA peak|sweep:" "$out/$isa.log" | head -4
done

{
    echo "# $model (family $family, model $number)"
    echo
    echo "Made by \`bash xtask/machine-bench.sh\` at ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(date -u '+%Y-%m-%d %H:%M UTC');"
    echo "each run's JSON and log are beside this file."
    for isa in widest avx2; do
        echo
        echo "## ${isa}"
        echo
        echo '```text'
        grep -E "^processor|FMA peak" "$out/$isa.log"
        echo '```'
        echo
        # The sweep's and the tile choices' Markdown tables, as the run printed them.
        sed -n '/^|/p; /^attention kernel, tiles/p' "$out/$isa.log"
    done
} > "$out/report.md.tmp" && mv "$out/report.md.tmp" "$out/report.md"
echo "wrote $out/report.md"
exit $status

#!/usr/bin/env bash
# The eight-shape benchmark on a machine with many cores, in minutes instead of an hour: eight
# `cargo xtask bench` invocations at once, each pinned (taskset) to two physical cores of its
# own, two shapes each, four on the widest instruction set and four with --isa avx2. Each ratio
# is still ours and the reference's in turns on the same two cores; the invocations share the
# L3, memory and package clock. This is how docs/benchmarks.md's "An Intel Xeon" was taken.
#
#   bash xtask/pairs-bench.sh [OUT_DIR [BENCH_FLAGS...]]   # default reports/bench/pairs
#   bash xtask/pairs-bench.sh reports/bench/pairs --profile    # with where ours spends its time
#
# XTASK names the xtask binary (default target/debug/xtask, built by `cargo build --bin xtask`),
# BENCH_PYTHON the Python with torch (and tensorflow), JOB_SECONDS each job's limit (default 600).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-reports/bench/pairs}
shift || true
extra=("$@") # passed on to every job
xtask=${XTASK:-target/debug/xtask}
python=${BENCH_PYTHON:-python3}
mkdir -p "$out"
[ -x "$xtask" ] || { echo "no xtask binary at $xtask (cargo build --bin xtask, or set XTASK)" >&2; exit 1; }

# One logical CPU per physical core, grouped by socket, taken two at a time.
mapfile -t pairs < <(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' | awk -F, '!seen[$2","$3]++ {print $3" "$1}' |
    sort -n -k1,1 -s | awk '{print $2}' | paste -sd' ' | awk '{for (i = 1; i + 1 <= NF; i += 2) print $i","$(i+1)}')
jobs=("--shape 32,136,4,6,4 --shape 2,1024,1024,8,128" "--shape 8,512,256,8,32 --shape 1,4096,64,4,16"
      "--shape 4,512,768,12,64 --shape 3,300,96,6,16" "--shape 4,1024,512,8,64 --shape 8,256,512,16,32")
runs=()
for shapes in "${jobs[@]}"; do runs+=("$shapes" "--isa avx2 $shapes"); done
if [ ${#pairs[@]} -lt ${#runs[@]} ]; then
    echo "${#pairs[@]} pairs of physical cores, ${#runs[@]} needed: run the jobs one after the other instead" >&2
    exit 1
fi
lscpu > "$out/lscpu.txt"
pids=()
for i in "${!runs[@]}"; do
    echo "job $i on CPUs ${pairs[$i]}: ${runs[$i]}"
    # shellcheck disable=SC2086 # the job's flags are words
    taskset -c "${pairs[$i]}" timeout "${JOB_SECONDS:-600}" "$xtask" bench --no-scaling --python "$python" \
        ${runs[$i]} "${extra[@]}" --json "$out/job$i.json" > "$out/job$i.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for i in "${!runs[@]}"; do
    echo "== job $i: ${runs[$i]}"
    grep -E "^processor|FMA peak|^\| [0-9]|sweep:|^    (forward|train_step|profile) " "$out/job$i.log" || tail -3 "$out/job$i.log"
done
exit $status

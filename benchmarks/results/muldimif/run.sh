#!/bin/bash
# The embedded models' MulDimIF answers (greedy, 192 new tokens as the IFBench evaluation, one
# torch thread), then scored by `mrtpo score`. The subsets (subset.py, seed 0): subset.json, 10
# rows per pattern x level (120) from the test set; subset-60.json, 5 per cell of subset.json
# (60), for Qwen's slower generation. Qwen runs under flock /tmp/qwen.lock (one Qwen process at
# a time on the shared machine).
#   bash benchmarks/results/muldimif/run.sh [generate|score]
set -u
cd "$(dirname "$0")/../../.."
export PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1
R=benchmarks/results/muldimif
timed() {  # name, command...
    local name=$1; shift
    /usr/bin/time -f "wall %e s, user %U s, sys %S s, max rss %M KB" -o "$R/$name.time" "$@" > "$R/$name.log" 2>&1
    echo "exit: $?; load: $(cat /proc/loadavg); finished: $(date -u +%FT%TZ)" >> "$R/$name.time"
}
if [ "${1:-generate}" = generate ]; then
    [ -f $R/smollm2-answers.jsonl ] || timed smollm2-generate python $R/generate.py smollm2-135m-instruct $R/subset.json $R/smollm2-answers.jsonl
    [ -f $R/qwen-answers.jsonl ] || timed qwen-generate flock /tmp/qwen.lock python $R/generate.py qwen2.5-coder-0.5b-instruct $R/subset-60.json $R/qwen-answers.jsonl
fi
score() {  # name, subset, answers
    mkdir -p $R/$1 && mrtpo score --task instructions --data $R/$2 --responses $R/$3 \
        --output_dir $R/$1 > $R/$1/table.txt 2>&1
}
[ -f $R/smollm2-answers.jsonl ] && score smollm2 subset.json smollm2-answers.jsonl && score smollm2-60 subset-60.json smollm2-answers.jsonl
[ -f $R/qwen-answers.jsonl ] && score qwen-60 subset-60.json qwen-answers.jsonl
true

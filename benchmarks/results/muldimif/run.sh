#!/bin/bash
# The embedded models' MulDimIF answers (greedy, 192 new tokens as the IFBench evaluation),
# one torch thread, then scored by `mrtpo score`. Qwen runs under flock /tmp/qwen.lock (one
# Qwen process at a time on the shared machine).
set -u
cd "$(dirname "$0")/../../.."
export PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1
R=benchmarks/results/muldimif
SUBSET=$R/subset.json
timed() {  # name, command...
    local name=$1; shift
    /usr/bin/time -f "wall %e s, user %U s, sys %S s, max rss %M KB" -o "$R/$name.time" "$@" > "$R/$name.log" 2>&1
    echo "exit: $?; load: $(cat /proc/loadavg); finished: $(date -u +%FT%TZ)" >> "$R/$name.time"
}
[ "${1:-generate}" = generate ] && {
    timed smollm2-generate python $R/generate.py smollm2-135m-instruct $SUBSET $R/smollm2-answers.jsonl
    timed qwen-generate flock /tmp/qwen.lock python $R/generate.py qwen2.5-coder-0.5b-instruct $SUBSET $R/qwen-answers.jsonl
}
for model in smollm2 qwen; do
    mrtpo score --task instructions --data $SUBSET --responses $R/$model-answers.jsonl \
        --output_dir $R/$model > $R/$model-score.txt 2>&1
done

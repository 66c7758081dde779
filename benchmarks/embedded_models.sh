#!/bin/bash
# The embedded models' figures (docs/results/embedded-models.md), one at a time, one torch
# thread, resumable: each run writes benchmarks/results/embedded/<name>/ (its outputs, log.txt,
# time.txt with wall/CPU/peak memory, the command, the exit code, the load and the CPU model)
# and is skipped once its time.txt says "exit: 0".
#   bash benchmarks/embedded_models.sh            # every figure still missing
#   bash benchmarks/embedded_models.sh NAME...    # only these
set -u
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1
BFCL=$(python -c "from mrtpo.tasks.tool_calling.data import bfcl_data_dir; print(bfcl_data_dir())")
IFEVAL=${IFEVAL:-../shared/benchmarks/ifeval/input_data.jsonl}
SPIDER=${SPIDER:-../shared/benchmarks/spider}
Q=qwen2.5-coder-0.5b-instruct
S=smollm2-135m-instruct
export BFCL IFEVAL SPIDER

timed() {
    local name=$1 command=$2 out=benchmarks/results/embedded/$1
    if [ -f "$out/time.txt" ] && grep -q "exit: 0" "$out/time.txt"; then echo "done: $name"; return; fi
    mkdir -p "$out"
    echo "running: $name"
    OUT=$out /usr/bin/time -f "wall %e s, user %U s, sys %S s, max rss %M KB" -o "$out/time.raw" \
        bash -c "$command" > "$out/log.txt" 2>&1
    local code=$?
    { cat "$out/time.raw"; echo "command: $command"; echo "exit: $code; load: $(cat /proc/loadavg)"
      echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; echo "finished: $(date -u +%FT%TZ)"; } > "$out/time.txt"
    rm -f "$out/time.raw"
}

declare -A FIGURES=(
    [qwen-bfcl-simple_python]="mrtpo eval --task tool_calling --model_name_or_path $Q --data \$BFCL --categories simple_python --max_examples 100 --output_dir \$OUT"
    [qwen-sql-first-steps]="python benchmarks/step_time.py --model $Q --task sql --prompts 4 --generations 4 --max-new-tokens 128 --variants gdpo --steps 2 --warmup 0 --threads 1 --json \$OUT/step_time.json"
    [qwen-tool-first-steps]="python benchmarks/step_time.py --model $Q --task tool_calling --prompts 4 --generations 4 --max-new-tokens 128 --variants gdpo --steps 2 --warmup 0 --threads 1 --json \$OUT/step_time.json"
    # The untrained <tool_call> rows fitted first (`mrtpo sft`'s default since), then the same check
    [qwen-tool-cold-start-fit]="mrtpo sft --config recipes/tool_calling-qwen2.5-coder-0.5b.yaml --output_dir outputs/sft-tool_calling-qwen-fit && python benchmarks/step_time.py --model outputs/sft-tool_calling-qwen-fit --task tool_calling --prompts 4 --generations 4 --max-new-tokens 128 --variants gdpo --steps 2 --warmup 0 --threads 1 --json \$OUT/step_time.json"
    # The untrained rows, and the tags' log p and rank before and after that cold start (after qwen-tool-cold-start-fit)
    [qwen-untrained-tokens]="python benchmarks/untrained_tokens.py --model $Q outputs/sft-tool_calling-qwen-fit --out \$OUT"
    # The rows left untrained (recorded before `--untrained_tokens` existed, when keep was all there was)
    [qwen-tool-cold-start]="mrtpo sft --config recipes/tool_calling-qwen2.5-coder-0.5b.yaml --untrained_tokens keep --output_dir outputs/sft-tool_calling-qwen && python benchmarks/step_time.py --model outputs/sft-tool_calling-qwen --task tool_calling --prompts 4 --generations 4 --max-new-tokens 128 --variants gdpo --steps 2 --warmup 0 --threads 1 --json \$OUT/step_time.json"
    # SmolLM2's budget, measured to break this model (stopped after step 0: INTERRUPTED.txt); not in ORDER
    [qwen-tool-cold-start-lr5e-5]="mrtpo sft --config recipes/tool_calling-qwen2.5-coder-0.5b.yaml --learning_rate 5e-5 --untrained_tokens keep --output_dir outputs/sft-tool_calling-qwen-lr5e-5 && python benchmarks/step_time.py --model outputs/sft-tool_calling-qwen-lr5e-5 --task tool_calling --prompts 4 --generations 4 --max-new-tokens 128 --variants gdpo --steps 2 --warmup 0 --threads 1 --json \$OUT/step_time.json"
    [qwen-sql-train3]="mrtpo train --config recipes/sql-qwen2.5-coder-0.5b.yaml --max_steps 3 --credit_map_steps 1 --output_dir outputs/qwen-sql-train3 && cp -r outputs/qwen-sql-train3/metrics.jsonl outputs/qwen-sql-train3/credit outputs/qwen-sql-train3/curves.png \$OUT/"
    # Two MRTPO steps on tool calling from the fitted cold start, beta 0.5 from the first step (needs qwen-tool-cold-start-fit)
    [qwen-tool-train2]="mrtpo train --config recipes/tool_calling-qwen2.5-coder-0.5b.yaml --model_name_or_path outputs/sft-tool_calling-qwen-fit --max_steps 2 --mrtpo_warmup_steps 0 --credit_map_steps 1 --output_dir outputs/qwen-tool-train2 && cp -r outputs/qwen-tool-train2/metrics.jsonl outputs/qwen-tool-train2/credit \$OUT/"
    [qwen-localization]="python benchmarks/localization.py --model_name_or_path $Q --n 12 --threads 1 --out \$OUT"
    [smollm2-localization]="python benchmarks/localization.py --n 12 --threads 1 --out benchmarks/results/localization"
    [qwen-bfcl-live_simple]="mrtpo eval --task tool_calling --model_name_or_path $Q --data \$BFCL --categories live_simple --max_examples 100 --output_dir \$OUT"
    [smollm2-bfcl-live_simple]="mrtpo eval --task tool_calling --model_name_or_path $S --data \$BFCL --categories live_simple --max_examples 100 --output_dir \$OUT"
    [qwen-ifeval]="mrtpo eval --task instructions --model_name_or_path $Q --data \$IFEVAL --max_examples 100 --output_dir \$OUT"
    [smollm2-ifeval]="mrtpo eval --task instructions --model_name_or_path $S --data \$IFEVAL --max_examples 100 --output_dir \$OUT"
    [qwen-spider-dev]="mrtpo eval --task sql --model_name_or_path $Q --data \$SPIDER --split dev --max_examples 200 --output_dir \$OUT"
    [smollm2-spider-dev]="mrtpo eval --task sql --model_name_or_path $S --data \$SPIDER --split dev --max_examples 200 --output_dir \$OUT"
)
ORDER=(qwen-bfcl-simple_python qwen-sql-first-steps qwen-tool-first-steps qwen-tool-cold-start qwen-tool-cold-start-fit qwen-untrained-tokens qwen-tool-train2 qwen-sql-train3 qwen-localization smollm2-localization
       qwen-bfcl-live_simple smollm2-bfcl-live_simple qwen-ifeval smollm2-ifeval qwen-spider-dev smollm2-spider-dev)
for name in "${@:-${ORDER[@]}}"; do
    [ -n "${FIGURES[$name]:-}" ] || { echo "unknown figure $name (one of: ${ORDER[*]})"; exit 2; }
    timed "$name" "${FIGURES[$name]}"
done

#!/usr/bin/env bash
# The prepared GPU check (see scripts/gpu_check.py's docstring): the shared-prompt path against
# TRL's per-row one (log-probs and gradients in fp32 and bf16, forward+backward time and memory,
# the SDPA kernels of each attention half), then GDPO (shared prompt on and off) and MRTPO bf16
# training steps side by side on one GPU: step-time ratios, replay seconds, peak memory, and the
# replay's distances in bf16 against fp32. Run from anywhere: bash scripts/gpu_check.sh [options]
#
# The GPU machine has torch, transformers, accelerate and peft but nothing else can be installed
# there from a registry: wheels in .whl/ (filled elsewhere, see the docstring) are installed
# into /tmp/site first. The results are printed and, when $OUT is set, written to
# $OUT/gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
exec python3 scripts/gpu_check.py "$@"

#!/usr/bin/env bash
# The main job: streams a 100,000-token prompt through the bundled default
# model on the CPU, generates 64 tokens, prints prefill tokens/s and ms per
# generated token.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh --target drt-bench
model=build/models/drt-random-gpt2
if [[ ! -f "$model/model.safetensors" ]]; then
  # No trained model is bundled yet: a randomly initialised one is made here.
  /usr/bin/python3 weights_tools/make_random_model.py --out "$model" \
    --tokenizer tests/fixtures/gpt2-tokenizer/tokenizer.json
fi
build/bench/drt-bench --model "$model" --prompt_tokens "${PROMPT_TOKENS:-100000}" --generate 64 "$@"

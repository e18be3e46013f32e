#!/usr/bin/env bash
# Fine-tunes models/drt-text-byte for 2-hop variable tracking on the CPU
# (docs/training.md, "2-hop fine-tune on the CPU"), same architecture:
#   bash weights_tools/fetch_text.sh && /usr/bin/python3 weights_tools/text_corpus.py   # once, on Debian
#   OUT=runs/twohop-cpu bash weights_tools/finetune_two_hop_cpu.sh
# One torch thread (the development machine has 2 shared cores; DEVICE=cuda
# runs the same recipe on a GPU, not tried), a fixed seed
# and a step budget (STEPS, default 400: the schedule, data and Gumbel noise
# follow the step count, so the same command gives the same run on the same
# torch build). STOP_MIN ends the invocation early with a full checkpoint
# ($OUT/train_state.pt; RESUME=1 continues it); the last invocation exports
# the model to $OUT/export.
#
# The mix is weighted towards two_hop_once (text_tasks.py: 2 to 4 chains,
# each asked once, questions padded, so every answer needs both hops); pass
# key, keyed needles and plain LM stay in it so that what the model already
# does is rehearsed. Short sequences (16 chunks, then 32) keep a CPU step at
# about 7 s; lr 3e-4 (a fifth of the from-scratch peak: the model is trained,
# the batch is small).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/twohop-cpu}
resume=()
[[ -n "${RESUME:-}" ]] && resume=(--resume "$out/train_state.pt")
"${PYTHON:-/usr/bin/python3}" weights_tools/train_any_text.py --out "$out" --device "${DEVICE:-cpu}" --threads 1 \
  --text "${TEXT:-$HOME/.cache/drt-text/text}" \
  --init "${INIT:-models/drt-text-byte}" \
  --mix two_hop_once:0.5,keyed:0.2,passkey:0.15,lm:0.15 --phases 0:16:4,0.5:32:2 \
  --lr 3e-4 --warmup 20 --seed 2026 --answer_weight 2 \
  --steps "${STEPS:-400}" --stop_after_min "${STOP_MIN:-0}" --save_every_min 5 \
  --eval 4096:16 --eval_tasks two_hop,keyed,passkey --eval_every_min 15 --final_eval "" --log_every 10 \
  "${resume[@]}" --export "$out/export" "$@"

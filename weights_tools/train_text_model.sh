#!/usr/bin/env bash
# Trains models/drt-text-byte (docs/training.md, "The bundled any-text model")
# on a CUDA GPU, in invocations that fit a 10-minute command:
#   bash weights_tools/fetch_text.sh && /usr/bin/python3 weights_tools/text_corpus.py   # once, on Debian
#   OUT=runs/text STOP_MIN=7.6 bash weights_tools/train_text_model.sh            # first invocation
#   OUT=runs/text STOP_MIN=7.3 RESUME=1 bash weights_tools/train_text_model.sh   # each later one
# Each invocation saves a full checkpoint (model, optimiser, schedule, random
# states) to $OUT/train_state.pt every 2 minutes and when STOP_MIN wall
# minutes have passed; the last one exports the model to $OUT/export.
# MINUTES is the training-time budget of the whole run (the schedule's
# length). PYTHON defaults to python3 (the GPU image's, with torch).
#
# MIX is the task mix. Its default (since 2026-11-25) moves 0.15 of plain
# LM to `repeat` (text_tasks.py: a passage, other text, the passage again
# past the window), so that retrieval is used for language modelling too;
# the needle tasks keep their shares (docs/training.md, "Copy objective (for
# the next GPU run)"). The bundled models/drt-text-byte was trained with
# MIX=lm:0.25,passkey:0.3,keyed:0.3,two_hop:0.15, the old default. The evals
# also log the read-twice gain and the filler NLL (READ_TWICE passages, 8 by
# default; 0 turns it off); they change nothing in the training.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/text}
resume=()
[[ -n "${RESUME:-}" ]] && resume=(--resume "$out/train_state.pt")
"${PYTHON:-python3}" weights_tools/train_any_text.py --out "$out" --device "${DEVICE:-cuda}" \
  --text "${TEXT:-$HOME/.cache/drt-text/text}" \
  --init none --hidden 192 --heads 4 --decoder_layers 2,2,2 --topk 8 --window 128 \
  --mix "${MIX:-lm:0.1,repeat:0.15,passkey:0.3,keyed:0.3,two_hop:0.15}" \
  --phases 0:16:32,0.25:32:16,0.5:64:16 \
  --lr 1.5e-3 --warmup 100 --seed 777 --answer_weight 2 \
  --minutes "${MINUTES:-8.2}" --stop_after_min "${STOP_MIN:-0}" --save_every_min 2 \
  --eval 4096:20,16384:10 --eval_every_min 4 --final_eval 4096:10 --log_every 50 \
  --read_twice "${READ_TWICE:-8}" \
  "${resume[@]}" --export "$out/export" "$@"

#!/usr/bin/env bash
# One prepared run for a lent GPU host (the device tool): both real engines on the embedded pair, plus the
# reference engine on CUDA, in a few minutes. Writes $OUT/device.json lines and $OUT/*.log.
#   WHEELHOUSE=DIR  install vllm / sglang from a folder of wheels (the device reaches no registry);
#                   without it, pip's configured index is used.
# Not run by CI: CI has no GPU. Its numbers go into the README when a session is lent a device.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-reports/device}"; mkdir -p "$OUT"
find_links=(); [ -n "${WHEELHOUSE:-}" ] && find_links=(--no-index --find-links "$WHEELHOUSE")
T=data/tiny-kimi/target; D=data/tiny-kimi/draft; R=data/tiny-kimi/draft-retrained
python3 -m venv .venv && .venv/bin/pip install -q "${find_links[@]}" -r requirements.txt torch && .venv/bin/pip install -q --no-deps -e .
python3 -m venv .venv-vllm && .venv-vllm/bin/pip install -q "${find_links[@]}" -r requirements-vllm-cuda.txt \
  && .venv-vllm/bin/pip install -q --no-deps --no-build-isolation -e .
python3 -m venv .venv-sglang && .venv-sglang/bin/pip install -q "${find_links[@]}" -r requirements-sglang-cuda.txt \
  && .venv-sglang/bin/pip install -q --no-deps --no-build-isolation -e .
run() { local name="$1"; shift; echo "[device] $name"; timeout 240 "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"; echo "[device] $name rc=$?"; }
# The reference engine on CUDA: deployed and trained wiring under SGLang 0.5.9's rules.
run ref-served .venv/bin/python -m helpers bench --target $T --draft $D --device cuda --steps 3 --repeats 2 --json
run ref-trained .venv/bin/python -m helpers bench --target $T --draft $D --device cuda --steps 3 --layout trained --repeats 2 --json
# vLLM (CUDA): the deployed draft as it reads it, the training layout written where it reads it, fix B.
run vllm-served .venv/bin/python -m helpers bench --backend vllm --target $T --draft $D --steps 3 --repeats 2 --json
run vllm-trained .venv/bin/python -m helpers bench --backend vllm --target $T --draft $D --steps 3 --layout trained --repeats 2 --json
run vllm-fixb .venv/bin/python -m helpers bench --backend vllm --target $T --draft $R --steps 3 --repeats 2 --json
# SGLang (CUDA, stock, no accommodations): its own rule, then the original case's 0.5.9 setter installed in the
# live engine (served (b3, b7, b10)), fix A's training layout under that setter, and the retrained draft.
run sglang-served .venv/bin/python -m helpers bench --backend sglang --target $T --draft $D --steps 3 --repeats 2 --json
run sglang-059 .venv/bin/python -m helpers bench --backend sglang --engine sglang==0.5.9 --target $T --draft $D --steps 3 --repeats 2 --json
run sglang-059-trained .venv/bin/python -m helpers bench --backend sglang --engine sglang==0.5.9 --target $T --draft $D --steps 3 --layout trained --repeats 2 --json
run sglang-fixb .venv/bin/python -m helpers bench --backend sglang --engine sglang==0.5.9 --target $T --draft $R --steps 3 --repeats 2 --json

#!/usr/bin/env bash
# One prepared run for a lent GPU host (the device tool): both real engines on the embedded pair, plus the
# reference engine on CUDA, in a few minutes. Not run by CI (CI has no GPU); its numbers go into the README
# when a session is lent a device.
#   bash .ci/device-check.sh            set up, run each bench, then summarize. $OUT ends up holding
#                                       summary.txt (one row per run: engine, rules, layout, accept length,
#                                       per-position acceptance, tok/s with range, speedup with interval,
#                                       measured slots, guard verdict; then each run's guard lines),
#                                       summary.json, setup.log and runs.tar.gz (each run's JSON, log, rc)
#   bash .ci/device-check.sh --dry-run  on any host, no GPU: print every command, check each parses with its
#                                       command's own parser, every path exists, and that the environment a
#                                       CUDA SGLang launch gets holds no CPU stand-in (.ci/device_dry_run.py)
# Where packages come from (a device reaches no registry, docs/install.md):
#   WHEELHOUSE=DIR   install vllm / sglang / the notebooks' venv from a folder of wheels (--no-index)
#   USE_REGISTRY=1   install from pip's configured index (the default when python3 has no torch)
#   otherwise        .venv is made over python3's own torch (--system-site-packages) with the workbook
#                    installed --no-deps; an engine venv that cannot be made is skipped, and its runs say so
# A venv already present (made before, or carried) is used as it is. A device reaches no model hub either:
# every model is a local folder, and transformers is told so (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE).
set -uo pipefail
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
cd "$(dirname "$0")/.."
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash .ci/device-check.sh [--dry-run]" >&2; exit 2 ;;
esac
OUT="${OUT:-reports/device}"
T=data/tiny-kimi/target; D=data/tiny-kimi/draft; R=data/tiny-kimi/draft-retrained
find_links=(); [ -n "${WHEELHOUSE:-}" ] && find_links=(--no-index --find-links "$WHEELHOUSE")
if [ -z "${USE_REGISTRY:-}" ]; then
  USE_REGISTRY=1; python3 -c 'import torch, transformers' 2> /dev/null && USE_REGISTRY=0
fi
# The SGLang capture rule (sglang==0.5.9) and the rules the benches apply are read from released sources
# kept in the workbook's cache; a carried .cache/eagle3-workbook is used when present.
[ -z "${EAGLE3_WORKBOOK_CACHE:-}" ] && [ -d .cache/eagle3-workbook ] && export EAGLE3_WORKBOOK_CACHE="$PWD/.cache/eagle3-workbook"

if [ "$DRY" = 1 ]; then
  CMDS="$(mktemp)"; trap 'rm -f "$CMDS"' EXIT
  step() { echo "[dry-run] would set up $1"; }
  run() { local name="$1"; shift; echo "[dry-run] would run $name: $*"; printf '%s\t%s\n' "$name" "${*@Q}" >> "$CMDS"; }
else
  mkdir -p "$OUT"; RUNS="$(mktemp -d)"; : > "$OUT/setup.log"
  step() {   # a venv already there (made before, or carried) is used as it is
    local venv=.venv; [ "$1" = main ] || venv=".venv-$1"
    if [ -x "$venv/bin/python" ]; then echo "[device] $venv: present, used as it is"; return; fi
    echo "[device] setting up $venv"
    "setup_$1" >> "$OUT/setup.log" 2>&1 || echo "[device] $venv: not set up (setup.log)"
  }
  summarize() {   # after every run, so a command stopped at its limit still brings back what ran
    python3 .ci/device_summary.py "$RUNS" --json "$OUT/summary.json" > "$OUT/summary.txt" 2>&1
    tar -czf "$OUT/runs.tar.gz" -C "$RUNS" .
  }
  run() {
    local name="$1"; shift; local need="" prev=""
    for a in "$@"; do [ "$prev" = "--backend" ] && need=".venv-$a/bin/python"; prev="$a"; done
    for py in "$1" $need; do
      if [ ! -x "$py" ]; then
        echo "[device] $name skipped: $py missing (see setup.log)"
        printf '{"skipped": "%s missing"}\n' "$py" > "$RUNS/$name.json"; echo skip > "$RUNS/$name.rc"
        summarize; return
      fi
    done
    echo "[device] $name"
    timeout 240 "$@" > "$RUNS/$name.json" 2> "$RUNS/$name.log"; local rc=$?
    echo "$rc" > "$RUNS/$name.rc"; echo "[device] $name rc=$rc"
    summarize
  }
fi

setup_main() {
  if [ "$USE_REGISTRY" = 1 ] || [ -n "${WHEELHOUSE:-}" ]; then
    python3 -m venv .venv && .venv/bin/pip install -q "${find_links[@]}" -r requirements.txt torch \
      && .venv/bin/pip install -q --no-deps -e .
  else    # the host's own torch and transformers (a device image), the workbook beside them without deps
    # --system-site-packages reaches the base interpreter's packages only; where python3 is itself a venv
    # (a device image's /opt/torch/.venv), a .pth names python3's own site-packages as well
    python3 -m venv --system-site-packages .venv || return 1
    local host_site venv_site
    host_site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    venv_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    [ "$host_site" = "$venv_site" ] || echo "$host_site" > "$venv_site/host_python3_site.pth"
    .venv/bin/pip install -q --no-index --no-deps --no-build-isolation -e .
  fi
}
setup_engine() {   # setup_engine vllm|sglang
  if [ "$USE_REGISTRY" = 0 ] && [ -z "${WHEELHOUSE:-}" ]; then
    echo "no WHEELHOUSE and no registry: .venv-$1 not made"; return 1
  fi
  python3 -m venv ".venv-$1" && ".venv-$1/bin/pip" install -q "${find_links[@]}" -r "requirements-$1-cuda.txt" \
    && ".venv-$1/bin/pip" install -q --no-deps --no-build-isolation -e .
}
setup_vllm() { setup_engine vllm; }
setup_sglang() { setup_engine sglang; }
step main; step vllm; step sglang

# The reference engine on CUDA: deployed and trained wiring under the rules bench assumes without --engine
# (it names them in its JSON; the summary's rules column shows them).
# Two prompts x 32 tokens: on an H200 (2026-12-04) the transformers DeepSeek forward of the tiny target is
# bound by kernel launches, and the default 6 x 64 x 2 repeats was still in its baseline passes at 140 s.
REF=(--num-prompts 2 --max-new-tokens 32)
run ref-served .venv/bin/python -m helpers bench --target $T --draft $D --device cuda --steps 3 --repeats 2 "${REF[@]}" --json
run ref-trained .venv/bin/python -m helpers bench --target $T --draft $D --device cuda --steps 3 --layout trained --repeats 2 "${REF[@]}" --json
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

if [ "$DRY" = 1 ]; then
  dry_py=.venv/bin/python; [ -x "$dry_py" ] || dry_py=python3
  "$dry_py" .ci/device_dry_run.py "$CMDS" --path "$T" --path "$D" --path "$R" --path requirements.txt \
    --path requirements-vllm-cuda.txt --path requirements-sglang-cuda.txt --path .ci/device_summary.py
  exit $?
fi
echo "[device] summary ($OUT/summary.txt):"
cat "$OUT/summary.txt"

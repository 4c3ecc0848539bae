#!/usr/bin/env bash
# The workbook's two commands:
#   bash workbook.sh run    set up (or reuse) .venv, then execute notebooks 01-06 into reports/
#   bash workbook.sh test   set up (or reuse) .venv, then run the test suite
set -euo pipefail
cd "$(dirname "$0")"

VENV="${WORKBOOK_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
  fi
  local want have=""
  want="$(cat requirements.txt | sha256sum | cut -d' ' -f1)"
  [ -f "$VENV/.requirements.sha256" ] && have="$(cat "$VENV/.requirements.sha256")"
  if [ "$want" != "$have" ]; then
    echo "[setup] installing requirements (CPU torch) into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
    echo "$want" > "$VENV/.requirements.sha256"
  fi
}

cmd="${1:-}"
shift || true
case "$cmd" in
  run)
    setup
    exec "$VENV/bin/python" -m helpers run-workbook "$@"
    ;;
  test)
    setup
    exec "$VENV/bin/python" -m pytest -q "$@" tests
    ;;
  *)
    echo "usage: bash workbook.sh run|test [options]" >&2
    exit 2
    ;;
esac

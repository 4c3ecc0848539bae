#!/usr/bin/env bash
# The workbook's commands:
#   bash workbook.sh run    set up (or reuse) .venv, then execute notebooks 01-06 into reports/
#   bash workbook.sh test   set up (or reuse) .venv, then lint (ruff) and run the test suite
#   bash workbook.sh lab    set up (or reuse) .venv, then open JupyterLab at the project root on the
#                           .venv kernel; options after `lab` go to `jupyter lab` (--no-browser --port 8890)
set -euo pipefail
cd "$(dirname "$0")"
here="$(pwd -P)"

VENV="${WORKBOOK_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$here/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"
# The notebooks' kernelspec name. Setup installs it into the venv's own prefix, so it always starts
# .venv/bin/python, whatever `python3` kernel the user's Jupyter dirs hold.
KERNEL=eagle3-workbook

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
  # The project itself, editable, so notebooks and scripts `import helpers` from any directory.
  # Checked from / so the working directory cannot stand in for the install; ~0.2 s when present.
  if ! (cd / && "$VENV/bin/python" -c "import helpers, sys; sys.exit(helpers.__file__ != '$here/helpers/__init__.py')" 2>/dev/null); then
    echo "[setup] installing this project (editable) into $VENV"
    # A setuptools new enough to build wheels by itself (70.1+, which requirements usually bring) builds
    # it offline; an older one (a bare venv has 65) lacks bdist_wheel, so pip fetches a build backend.
    local isolation=()
    "$VENV/bin/python" -c "import setuptools, sys; sys.exit(tuple(map(int, setuptools.__version__.split('.')[:2])) < (70, 1))" \
      2>/dev/null && isolation=(--no-build-isolation)
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${isolation[@]}" -e .
  fi
  local spec="$VENV/share/jupyter/kernels/$KERNEL/kernel.json"
  if ! grep -qF "\"$VENV/bin/python\"" "$spec" 2>/dev/null; then
    echo "[setup] registering the $KERNEL kernel ($VENV/bin/python) in $VENV"
    "$VENV/bin/python" -m ipykernel install --sys-prefix --name "$KERNEL" \
      --display-name "Python ($KERNEL .venv)" > /dev/null
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
    # lint first: a stray import or an over-long line fails in a second, not after the suite
    "$VENV/bin/python" -m ruff check --quiet helpers tests
    exec "$VENV/bin/python" -m pytest -q "$@" tests
    ;;
  lab)
    setup
    echo "[lab] JupyterLab at $here, kernel $KERNEL = $VENV/bin/python"
    echo "[lab] open notebooks/01_baseline_throughput.ipynb and run it top to bottom, then 02-06; reports/ holds executed copies"
    # The venv's own Jupyter dirs first, so its kernelspec wins over one of the same name elsewhere.
    JUPYTER_PREFER_ENV_PATH=1 exec "$VENV/bin/python" -m jupyterlab --ServerApp.root_dir="$here" "$@"
    ;;
  *)
    echo "usage: bash workbook.sh run|test|lab [options]" >&2
    exit 2
    ;;
esac

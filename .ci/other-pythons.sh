#!/usr/bin/env bash
# The Python versions students have besides the main one (.venv): for each that this machine
# provides, build an environment from the same pinned pyproject.toml and run the fast tests,
# a kernel under nbval (notebook 00) and a cluster smoke test (sync, SSP and async Downpour on
# one PS task, with their event-log invariants). The full notebooks stay on the main version.
# Usage: bash .ci/other-pythons.sh [--install-only | --test-only] [3.12 3.13 ...]; exits
# non-zero if any version fails. The environments install side by side (mostly downloads), so
# CI starts --install-only in the background while the main tests run, then --test-only; the
# versions' tests run side by side, the fast ones in two pytest-xdist workers each.
set -uo pipefail
cd "$(dirname "$0")/.."
phase=all
case "${1:-}" in
  --install-only) phase=install; shift ;;
  --test-only) phase=test; shift ;;
esac
versions=("$@")
[ $# -gt 0 ] || versions=(3.12 3.13)

find_python() {  # an interpreter for minor version $1, or nothing
  local candidate
  for candidate in "$(command -v "python$1" 2>/dev/null)" \
                   "$(pyenv root 2>/dev/null)"/versions/"$1".*/bin/python; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
  done
}

install() {  # the pinned packages into .venv-$1 (interpreter $2); its pip log: .venv-$1-pip.log
  # The project itself is installed later, one version at a time: an editable install writes
  # its metadata into this folder, which two installs at once would race for.
  local venv=".venv-$1" log=".venv-$1-pip.log"
  { [ -x "$venv/bin/python" ] || "$2" -m venv "$venv"; } > "$log" 2>&1 \
    && "$venv/bin/python" -m pip install -q --upgrade pip >> "$log" 2>&1 \
    && "$venv/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open(
         "pyproject.toml", "rb"))["project"]["dependencies"]))' > "$venv/requirements.txt" \
    && "$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" >> "$log" 2>&1
}

STEP_LIMIT=${STEP_LIMIT:-900}  # seconds: an install, the fast tests, or the notebook and smoke
start=$(date +%s)
# CI's own clock: .ci/run exports when it began; past CI_BUDGET seconds from then no step
# starts, so CI ends with a message naming what was left out rather than at its hard limit
CI_START=${CI_START:-$start}
CI_BUDGET=${CI_BUDGET:-5100}
limit() {  # seconds the next step may take: STEP_LIMIT, or what is left of the budget
  local left=$(( CI_START + CI_BUDGET - $(date +%s) ))
  if [ "$left" -lt 120 ]; then
    echo "python: no CI time left for $1 (${CI_BUDGET} s budget since CI began): not run" >&2
    return 1
  fi
  echo $(( left < STEP_LIMIT ? left : STEP_LIMIT ))
}
# the cluster smoke test: three modes' event-log invariants on one PS task (one cluster)
SMOKE=(
  "test_async_downpour_trains_and_records_staleness[ps1]"
  "test_sync_averages_exactly_n_gradients_of_the_current_version[ps1]"
  "test_ssp_gap_never_exceeds_staleness[ps1]"
)
status=0
declare -A pids
ready=()
for v in "${versions[@]}"; do
  py=$(find_python "$v")
  if [ -z "$py" ]; then
    echo "python $v: skipped, no interpreter on this machine (python$v or pyenv)"
    continue
  fi
  if [ "$phase" = test ]; then  # installed by an earlier --install-only, which said how it went
    if [ -f ".venv-$v/.installed" ]; then ready+=("$v"); else
      echo "python $v: not installed (see .venv-$v-pip.log)" >&2; status=1; fi
    continue
  fi
  echo "python $v: $("$py" --version 2>&1) at $py; installing into .venv-$v"
  secs=$(limit "python $v's install") || { status=1; continue; }
  timeout --kill-after=20 "$secs" bash -c "$(declare -f install); install $v $py && touch .venv-$v/.installed" &
  pids[$v]=$!
done
for v in "${!pids[@]}"; do
  if wait "${pids[$v]}"; then
    ready+=("$v")
  else
    tail -n 30 ".venv-$v-pip.log" >&2
    echo "python $v: the pinned packages did not install (log: .venv-$v-pip.log)" >&2
    status=1
  fi
done
[ "$phase" = test ] || echo "installed ${ready[*]:-nothing} in $(( $(date +%s) - start )) s"
[ "$phase" != install ] || exit $status

test_version() {  # the fast tests, then notebook 00 under nbval and the cluster smoke test
  local v=$1 t secs status=0
  t=$(date +%s)
  # each step has a deadline (several times what it takes here), so that a hang fails with
  # its name in the log instead of using up CI's whole budget
  echo "python $v: fast tests, then notebook 00 under nbval and the cluster smoke test"
  if secs=$(limit "python $v's fast tests"); then
    timeout --kill-after=20 "$secs" ".venv-$v/bin/python" -m pytest -q -n 2 -m "not slow" tests \
      || { echo "python $v: the fast tests failed (or ran past $secs s)" >&2; status=1; }
  else
    status=1
  fi
  echo "python $v: fast tests done after $(( $(date +%s) - t )) s"
  if secs=$(limit "python $v's notebook 00 and cluster smoke test"); then
    LABS_QUICK=1 timeout --kill-after=20 "$secs" ".venv-$v/bin/python" -m pytest -q \
      --nbval-lax --nbval-current-env --nbval-cell-timeout=300 notebooks/00_index.ipynb \
      "${SMOKE[@]/#/tests/test_cluster_integration.py::}" \
      || { echo "python $v: notebook 00 or the cluster smoke test failed (or ran past $secs s)" >&2; status=1; }
  else
    status=1
  fi
  echo "python $v: tested in $(( $(date +%s) - t )) s"
  return $status
}

installed=()
for v in $(printf '%s\n' "${ready[@]}" | sort); do
  if ".venv-$v/bin/python" -m pip install -q --no-deps -e . >> ".venv-$v-pip.log" 2>&1; then
    installed+=("$v")
  else
    echo "python $v: the project did not install (log: .venv-$v-pip.log)" >&2
    status=1
  fi
done
# The versions are tested at the same time, each into a log of its own, shown in turn when all
# are done: much of the fast tests is waiting (for a process to die, a timeout to pass), so
# two versions' tests side by side take less than one after the other.
declare -A testers
for v in "${installed[@]}"; do
  test_version "$v" > ".ci-python-$v.log" 2>&1 &
  testers[$v]=$!
done
for v in "${installed[@]}"; do
  wait "${testers[$v]}" || status=1
  cat ".ci-python-$v.log"
done
exit $status

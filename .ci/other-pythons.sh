#!/usr/bin/env bash
# The Python versions students have besides the main one (.venv): for each that this machine
# provides, build an environment from the same pinned pyproject.toml and run the fast tests
# and notebook 05 in quick mode. The full notebooks stay on the main version.
# Usage: bash .ci/other-pythons.sh [3.12 3.13 ...]; exits non-zero if any version fails.
set -uo pipefail
cd "$(dirname "$0")/.."
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

status=0
for v in "${versions[@]}"; do
  start=$(date +%s)
  py=$(find_python "$v")
  if [ -z "$py" ]; then
    echo "python $v: skipped, no interpreter on this machine (python$v or pyenv)"
    continue
  fi
  venv=".venv-$v"
  log="$venv-pip.log"
  echo "python $v: $("$py" --version 2>&1) at $py; installing into $venv (log: $log)"
  if ! { [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"; } \
      || ! "$venv/bin/python" -m pip install -q --upgrade pip > "$log" 2>&1 \
      || ! "$venv/bin/python" -m pip install -q -e . >> "$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "python $v: the pinned packages did not install" >&2
    status=1
    continue
  fi
  echo "python $v: installed in $(( $(date +%s) - start )) s; fast tests, then notebook 05 (quick)"
  "$venv/bin/python" -m pytest -q -m "not slow" tests || status=1
  LABS_QUICK=1 "$venv/bin/python" -m pytest -q --nbval-lax --nbval-current-env \
    --nbval-cell-timeout=900 notebooks/05_parameter_server.ipynb || status=1
  echo "python $v: done in $(( $(date +%s) - start )) s"
done
exit $status

#!/usr/bin/env bash
# The GPU machine's prepared run (bench/GPU.md), from the repository root of a copy of the
# working tree, with the wheels `make gpu-wheels` built here (nothing compiles or downloads
# there):
#
#   bash bench/gpu-run.sh [--cpu-smoke] [WHEELS]      # WHEELS: .gpuwheels
#
# Phases, each with a time limit (all together under 8 minutes): install the wheels into a
# temporary folder (pip --no-index --no-deps --target; chute's compiled core from its wheel,
# its Python from this tree), check every import, run the CUDA stress test
# (tests/test_device_cuda.py), then bench/gpu.py, which writes bench/results/gpu.md. Logs,
# the table and its figures also go to $OUT when it is set (the device tool brings that
# folder back); the end says where each phase's time went. --cpu-smoke rehearses it all on a
# machine without CUDA (tiny sizes; the table goes to $OUT or a temporary folder, never over
# bench/results/gpu.md). PYTHON picks the interpreter (default python3, the one with torch).
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0
wheels=.gpuwheels
for arg in "$@"; do
  case "$arg" in
    --cpu-smoke) smoke=1 ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "gpu-run: unknown option $arg" >&2; exit 2 ;;
    *) wheels=$arg ;;
  esac
done
smoke_flag=()
[ "$smoke" = 1 ] && smoke_flag=(--cpu-smoke)

export PY=${PYTHON:-python3}
case $wheels in
  /*) export WHEELS=$wheels ;;
  *) export WHEELS=$PWD/$wheels ;;
esac
WORK=$(mktemp -d /tmp/chute-gpu-run.XXXXXX)
export SITE=$WORK/site
LOGS=${OUT:-$WORK}
mkdir -p "$LOGS"
begin=$(date +%s)
summary=()
failed=0

# phase NAME SECONDS COMMAND...: the command under a time limit, its output also in
# $LOGS/NAME.log; its time and outcome go into the summary. ALLOW_RC=N: exit N is no failure.
phase() {
  local name=$1 limit=$2
  shift 2
  echo
  echo "== $name (at most ${limit} s)"
  local t0 rc=0
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log" || rc=$?
  local ms status=ok
  ms=$((($(date +%s%N) - t0) / 1000000))
  if [ "$rc" != 0 ] && [ "$rc" = "${ALLOW_RC:-}" ]; then
    status="ok (exit $rc allowed)"
    rc=0
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    status="TIMED OUT at ${limit} s"
  elif [ "$rc" != 0 ]; then
    status="FAILED (exit $rc)"
  fi
  [ "$rc" = 0 ] || failed=1
  summary+=("$(printf '%-8s %4d.%d s  %s' "$name" $((ms / 1000)) $((ms % 1000 / 100)) "$status")")
  return "$rc"
}

install() {
  set -euo pipefail
  local tag
  tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  if ! ls "$WHEELS"/chute-*-"$tag"-*.whl > /dev/null 2>&1; then
    echo "no chute wheel for $tag in $WHEELS ($(ls "$WHEELS" 2>&1 | tr '\n' ' ')):"
    echo "build it with \`make gpu-wheels\` (GPU_PYTHON picks the Python) and carry $WHEELS"
    return 1
  fi
  if ! sha256sum --quiet -c "$WHEELS/native-sources.sha256"; then
    echo "the compiled core in $WHEELS was built from other C sources than this tree's:"
    echo "build the wheels again (\`make gpu-wheels\`)"
    return 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$WHEELS"/*.whl
  # chute's compiled core from the wheel, its Python from this tree (edited since, maybe)
  mkdir -p "$SITE/.native"
  mv "$SITE"/chute/_native/*.so "$SITE/.native/"
  rm -rf "$SITE/chute"
  cp -r src/chute "$SITE/chute"
  find "$SITE/chute" \( -name '*.so' -o -name '__pycache__' \) -prune -exec rm -rf {} +
  mv "$SITE"/.native/*.so "$SITE/chute/_native/"
  echo "installed into $SITE: $(ls "$SITE" | grep -v dist-info | tr '\n' ' ')"
}
export -f install

echo "gpu-run: $(date -u +%FT%TZ), $(nproc) cores, $("$PY" -V 2>&1) ($PY), wheels $WHEELS," \
  "logs in $LOGS$([ "$smoke" = 1 ] && echo ', CPU smoke run')"
if command -v nvidia-smi > /dev/null; then
  timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm \
    --format=csv,noheader || echo "nvidia-smi did not answer"
fi
# chute's core links libzstd.so.1 from the system; the wheels folder has one for a machine
# without it
if ! "$PY" -c 'import ctypes; ctypes.CDLL("libzstd.so.1")' 2> /dev/null; then
  echo "no libzstd.so.1 on this machine: using the one in $WHEELS/lib"
  export LD_LIBRARY_PATH=$WHEELS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

if phase install 40 bash -c install; then
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  export XLA_PYTHON_CLIENT_PREALLOCATE=false # JAX takes GPU memory as it needs it, not 75%
  if phase imports 60 "$PY" bench/_gpu_check.py "${smoke_flag[@]}"; then
    if "$PY" -c 'import pytest' 2> /dev/null; then
      # a smoke run without torch skips the whole module: pytest's exit 5, no test ran
      allow=$([ "$smoke" = 1 ] && echo 5 || true)
      ALLOW_RC=$allow phase stress 90 "$PY" -m pytest -q -p no:cacheprovider \
        tests/test_device_cuda.py || true
    else
      echo "== stress: pytest is missing (carry its wheel); tests/test_device_cuda.py not run"
      summary+=("stress      0.0 s  NOT RUN (no pytest)")
      failed=1
    fi
    if [ "$smoke" = 1 ]; then
      table=$LOGS/gpu-smoke.md
    else
      table=bench/results/gpu.md
    fi
    phase bench 260 "$PY" bench/gpu.py "${smoke_flag[@]}" --budget 240 --out "$table" \
      --json "$LOGS/gpu.json" || true
    if [ -f "$table" ] && [ "$table" != "$LOGS/gpu-smoke.md" ]; then
      cp "$table" "$LOGS/"
    fi
  fi
fi

echo
echo "== where the time went ($(($(date +%s) - begin)) s in all)"
printf '%s\n' "${summary[@]}"
echo "logs and results: $LOGS ($(ls "$LOGS" | tr '\n' ' '))"
if [ -n "${table:-}" ] && [ -f "$table" ]; then
  echo
  cat "$table"
fi
exit "$failed"

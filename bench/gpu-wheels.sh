#!/usr/bin/env bash
# The wheels bench/gpu-run.sh installs on the GPU machine, so that nothing compiles or downloads
# there (bench/GPU.md): chute built here for CPython 3.12 (the machine's Python) and tagged
# manylinux (its compiled core links the system's libzstd.so.1 at run time), and the wheels of
# what the machine lacks: loaderx 0.7.3 and cffi (the loaderx rows), zarr, numcodecs, donfig,
# google-crc32c and obstore (chute.insitu). numpy, torch, jax, pytest, typing-extensions,
# packaging, pyyaml and tqdm are already there (/work/.library/device/KINDS.md).
#
#   bash bench/gpu-wheels.sh [DIR]       # default DIR: .gpuwheels (ignored by git)
#
# GPU_PYTHON=python3.11 builds for another Python (a rehearsal on one with a CPU torch).
# Also kept in DIR: lib/libzstd.so.1 (used only where the machine has none) and the hashes of
# the C sources the wheel was built from (gpu-run.sh refuses a stale compiled core).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-.gpuwheels}
# The versions the test environment here runs against (pyproject: loaderx==0.7.3,
# zarr>=3.1, obstore>=0.6), one of each: pip refuses an install holding two.
PEERS=(loaderx==0.7.3 cffi==2.1.1 pycparser==3.12 zarr==3.1.6 numcodecs==0.16.6
  donfig==0.8.1.post1 google-crc32c==1.9.0 obstore==0.12.1)

py=${GPU_PYTHON:-}
if [ -z "$py" ]; then
  if python3.12 -V > /dev/null 2>&1; then
    py=python3.12
  elif command -v pyenv > /dev/null; then
    v=$(pyenv versions --bare | grep '^3\.12\.' | tail -1 || true)
    [ -n "$v" ] && py="$(pyenv root)/versions/$v/bin/python3.12"
  fi
fi
if [ -z "$py" ] || ! "$py" -V > /dev/null 2>&1; then
  echo "gpu-wheels: no python3.12 here (set GPU_PYTHON to one)" >&2
  exit 1
fi
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
command -v readelf > /dev/null || { echo "gpu-wheels: readelf (binutils) is needed" >&2; exit 1; }
echo "gpu-wheels: building for Python $ver ($("$py" -c 'import sys; print(sys.executable)'))"

rm -rf "$dir"
mkdir -p "$dir/lib"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# chute, built from a clean copy of the sources (no stale objects from build/)
mkdir -p "$work/src"
cp -r pyproject.toml setup.py MANIFEST.in README.md src "$work/src/"
find "$work/src" \( -name '*.so' -o -name '__pycache__' -o -name '*.egg-info' \) -prune \
  -exec rm -rf {} +
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
built=$(ls "$work"/dist/chute-*.whl)
"$py" bench/_gpu_wheel.py "$built" > "$work/tagged"
mv "$(cat "$work/tagged")" "$dir/"
sha256sum setup.py src/chute/_native/*.c src/chute/_native/*.h > "$dir/native-sources.sha256"

# the peers, as wheels for CPython $ver on manylinux x86-64
platforms=()
for n in $(seq 5 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
  --platform manylinux1_x86_64)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$ver" \
  --implementation cp "${platforms[@]}" -d "$dir" "${PEERS[@]}"

# the system's libzstd, for a machine that lacks one (gpu-run.sh uses it only then)
zstd=$(ldconfig -p | awk '/libzstd\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$zstd" ] && cp -L "$zstd" "$dir/lib/libzstd.so.1"

ls -l "$dir" "$dir/lib"
echo "gpu-wheels: $(du -sh "$dir" | cut -f1) in $dir (the device tool carries 64 MiB at most)"

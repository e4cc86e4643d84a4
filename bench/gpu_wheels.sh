#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with the wheels that relpos_jax needs at run time and that a GPU
# machine's image may lack, for CPython 3.12 on x86-64 Linux, at the versions pinned in
# constraints.txt; bench/gpu.sh installs them there with pip --no-index (no network needed).
#
#   bash bench/gpu_wheels.sh          # here, where pip reaches the package index
#
# The list: what `import relpos_jax` and `import relpos_jax.data` load (ml_collections, grain,
# tensorflow-datasets, array_record, tensorboardX for train.py) and what those require, less what
# the image already holds (jax, flax, optax, orbax-checkpoint, chex, numpy, absl-py, etils, protobuf,
# pyarrow, psutil, wrapt, attrs, ...). protobuf goes to .whl/extra/: gpu.sh installs it only if
# relpos_jax.data does not import with the image's own. A package with no wheel on the index
# (promise) is built here into a pure-Python wheel from its source.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PACKAGES=(
  ml_collections tensorflow-datasets tensorflow-metadata googleapis-common-protos array_record
  grain dm-tree immutabledict importlib_resources promise simple-parsing docstring_parser
  portpicker termcolor toml tensorboardX
)
EXTRA=(protobuf)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
  manylinux1_x86_64)

pinned() {  # NAME==VERSION from constraints.txt ('-', '_' and '.' alike, any case)
  local pattern
  pattern=$(echo "$1" | sed 's/[-_.]/[-_.]/g')
  grep -i -m1 -E "^${pattern}==" constraints.txt || { echo "$1: not pinned in constraints.txt" >&2; exit 1; }
}

fetch() {  # fetch DIR NAME
  local spec
  spec=$(pinned "$2")
  if ! $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]/#/--platform=}" -d "$1" "$spec" 2>/dev/null; then
    echo "$spec: no wheel on the index; building one from its source"
    $PY -m pip wheel -q --no-deps --no-binary=:all: -w "$1" "$spec"
    ls "$1" | grep -i -E "^$(echo "${spec%%==*}" | sed 's/[-_.]/[-_.]/g')-.*-none-any\.whl$" >/dev/null \
      || { echo "$spec: the wheel built here is not pure Python" >&2; exit 1; }
  fi
}

rm -rf .whl && mkdir -p .whl/extra
for name in "${PACKAGES[@]}"; do fetch .whl "$name"; done
for name in "${EXTRA[@]}"; do fetch .whl/extra "$name"; done

# One version of each package (two would stop the whole install), every one a wheel.
names=$(ls .whl/*.whl .whl/extra/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-.' 'a-z__' | sort)
if [ -n "$(echo "$names" | uniq -d)" ]; then
  echo "two versions of: $(echo "$names" | uniq -d | tr '\n' ' ')" >&2
  exit 1
fi
ls -1 .whl/*.whl .whl/extra/*.whl
echo "$(ls .whl/*.whl .whl/extra/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"

# Sourced by bench/gpu.sh and experiments/device.sh: makes an accelerator machine's own python3 and
# jax (no network) ready for relpos_jax. `device_env LOG` (the caller defines say MESSAGE):
#
# 1. installs the wheels of .whl/ (bash bench/gpu_wheels.sh fills it where pip reaches the index)
#    with pip --no-index into /tmp/site, and .whl/extra's protobuf only where relpos_jax.data does
#    not import with the image's own;
# 2. puts /tmp/site and this checkout on PYTHONPATH, turns on JAX's persistent compilation cache
#    (/tmp/jax_cache: a later process loads what an earlier one compiled) and unbuffered output;
# 3. where .data/ is carried (experiments/device.sh --prepare fills it), makes it the datasets'
#    folder (RELPOS_DATA_DIR): the corpus the results were measured on, whatever Python this is.
device_env() {
  local log=$1
  if compgen -G ".whl/*.whl" >/dev/null; then
    say "installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into /tmp/site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || say "pip could not install .whl/ (above); going on without it"
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONUNBUFFERED=1
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
  if [ -d .data ]; then
    export RELPOS_DATA_DIR=$PWD/.data
  fi
  if ! $PY -c "import relpos_jax.data" >/tmp/device_env_import.log 2>&1; then
    # The carried protobuf, only where the image's cannot load the carried generated code.
    if compgen -G ".whl/extra/*.whl" >/dev/null; then
      say "relpos_jax.data does not import: $(tail -n1 /tmp/device_env_import.log); adding .whl/extra"
      rm -rf /tmp/site
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl .whl/extra/*.whl 2>&1 | tee -a "$log"
    fi
    $PY -c "import relpos_jax.data" >/tmp/device_env_import.log 2>&1 \
      || say "relpos_jax.data does not import: $(tail -n1 /tmp/device_env_import.log)"
  fi
}

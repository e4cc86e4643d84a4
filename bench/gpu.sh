#!/usr/bin/env bash
# relpos_jax on an accelerator, in three parts:
#  1. the kernel tests on the device: the Pallas kernels compiled (not interpreted) against the
#     float64 reference and the tiled path, and their lowering;
#  2. one attention layer, forward and backward, bf16, T = 1k … 32k: the kernels against the tiled
#     and dense paths and cuDNN (bench.fused_attention -> docs/results/fused_attention.{json,md});
#  3. training tokens/s and MFU (model FLOPs per second over the device's dense peak) for
#     txl_base_enwik8's sizes (12 layers, d_model 512, segment and memory 512, batch 22) and a
#     larger model (24 layers, d_model 1024, d_ff 4096), dense and through the kernels, bf16 and
#     float32; appended as a dated table to docs/results/gpu.md.
#
#   pip install -e '.[cuda,test]'    # JAX with CUDA and pytest (or '.[tpu,test]' on a TPU VM)
#   bash bench/gpu.sh
#
# Targets: the txl kernel at T = 8k forward+backward within 1.5x of cuDNN with RoPE; >= 40% MFU in
# bf16 for d_model >= 1024 on an H200; for txl_base_enwik8, more tokens/s than NVIDIA's published
# PyTorch Transformer-XL base figure on one A100 (59,961 tokens/s) scaled by the two devices' bf16
# peaks (x 989/312 on an H100/H200: 190,064 tokens/s).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
device=$($PY -c 'import jax; print(jax.devices()[0].device_kind)')
echo "== kernel tests on $device"
$PY -m pytest -q -p no:randomly tests/kernel_vs_reference_test.py tests/kernel_vs_tiled_test.py \
  tests/kernel_lowering_test.py
echo "== one attention layer"
$PY -m bench.fused_attention --out docs/results
{
  echo
  echo "## $device, $(date -u +%F)"
  echo
  echo "Command: \`bash bench/gpu.sh\` (\`python -m bench.mfu --size base,large\`), jax $($PY -c 'import jax; print(jax.__version__)')."
  echo
  $PY -m bench.mfu --size base,large --dtypes bfloat16,float32 --repeats 10 --warmup 3
  echo
  echo 'Through the Pallas kernels (model.attention_impl=kernel):'
  echo
  $PY -m bench.mfu --size base,large --dtypes bfloat16 --repeats 10 --warmup 3 --attention-impl kernel
  echo
  echo 'The same large model with model.remat (each layer recomputed in the backward pass):'
  echo
  $PY -m bench.mfu --size large --dtypes bfloat16 --repeats 10 --warmup 3 --remat --attention-impl kernel
} | tee -a docs/results/gpu.md

"""Load the released Transformer-XL models into relpos_jax run directories.

Two routes, one result — a work directory that ``relpos_jax.evaluate.restore_model`` and
``eval.py --config <workdir>/config.py --workdir <workdir>`` read:

* ``huggingface.convert(folder, workdir)``: a HuggingFace ``transfo-xl`` folder (``config.json`` +
  ``model.safetensors`` or ``pytorch_model.bin``, e.g. ``transfo-xl-wt103``); the config comes from
  ``config.json``, and the tokenizer's ``vocab.pkl`` / ``vocab.bin``, if present, becomes
  ``vocab.txt``.
* ``tensorflow.convert(prefix, config, workdir)``: an official TensorFlow checkpoint
  (kimiyoung/transformer-xl ``tf/``), whose settings come from a relpos_jax config.

Command line: ``python -m relpos_jax.convert huggingface|tensorflow --help``. Reading the weights
needs the ``convert`` extra (torch for ``pytorch_model.bin``, TensorFlow for checkpoints), which
the main environment does not install: ``make test-convert`` sets up ``.venv-convert``. What maps
to what, and what differs between HuggingFace, the official code and relpos_jax, is in the
docstrings of ``huggingface`` and ``tensorflow``.
"""

from relpos_jax.convert.common import ConvertError

__all__ = ["ConvertError"]

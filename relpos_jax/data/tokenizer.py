"""The byte-level tokenizer: vocabulary 256, every byte string encodes (no unknown symbol)."""

from __future__ import annotations

import numpy as np

VOCAB_SIZE = 256


def encode(text: str | bytes) -> np.ndarray:
    """UTF-8 bytes of ``text`` (or ``text`` itself if bytes) as a ``uint8`` array."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return np.frombuffer(data, np.uint8).copy()


def decode(tokens) -> str:
    """Tokens back to text; bytes that are not valid UTF-8 show as U+FFFD."""
    return bytes(np.asarray(tokens, np.uint8).tolist()).decode("utf-8", errors="replace")

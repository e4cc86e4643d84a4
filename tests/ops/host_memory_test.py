"""``host_memory.reuse_freed_memory``: freed large buffers are reused, not faulted in again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROGRAM = """
import resource, sys
import numpy as np
from relpos_jax.ops import host_memory
applied = host_memory.reuse_freed_memory() if sys.argv[1] == "reuse" else False
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
buffer = np.ones(2**24); del buffer  # 128 MiB, touched once
before = faults()
for _ in range(5):
    buffer = np.ones(2**24); del buffer
print(applied, faults() - before)
"""


def _run(mode: str, **env) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True,
        env={**os.environ, **env},
    ).stdout.split()  # fmt: skip
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_buffers_are_reused_instead_of_faulted_in_again():
    applied, faults = _run("reuse")
    default_applied, default_faults = _run("default")
    assert (applied, default_applied) == ("True", "False")
    assert default_faults > 100  # each 128 MiB buffer is mapped afresh and faulted in
    assert faults < default_faults / 10


def test_environment_opts_out():
    applied, _ = _run("reuse", RELPOS_JAX_SYSTEM_MALLOC="1")
    assert applied == "False"

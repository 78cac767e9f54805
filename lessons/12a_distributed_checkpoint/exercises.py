"""Lesson 12a exercises: a safetensors header read by hand. Check your answer with
`make exercises N=12a`."""

import json  # noqa: F401  (you will need these)
import struct  # noqa: F401
from pathlib import Path  # noqa: F401


def safetensors_header(path):
    """{name: (dtype, shape, (start, end))} for every tensor of a safetensors file, read by
    hand: 8 bytes of little-endian header length, then a JSON header. Skip the optional
    "__metadata__" entry; shape as a tuple of ints."""
    raise NotImplementedError

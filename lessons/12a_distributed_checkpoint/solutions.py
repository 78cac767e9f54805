"""Lesson 12a solutions (one way; `make test` runs the exercise tests against this file)."""

import json
import struct
from pathlib import Path


def safetensors_header(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return {name: (info["dtype"], tuple(info["shape"]), tuple(info["data_offsets"]))
            for name, info in header.items() if name != "__metadata__"}

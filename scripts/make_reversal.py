"""Make `data/reversal.csv`: the task lesson 14 trains a small GPT on.

Each example is a string of 6 random digits, the character `>`, and the same digits in
reverse order: `482913>319284`. The model reads the first 7 characters and must write the
last 6; success is measured exactly (all 6 right), not only by the loss. 2,000 training and
500 held-out strings, all different (the held-out ones never appear in training), drawn
from NumPy's PCG64 generator with a fixed seed, so the file is the same on every run:
`python -m scripts.make_reversal` rewrites it byte for byte (a test of lesson 14 checks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "reversal.csv"
DIGITS = 6  # digits per string
COUNTS = {"train": 2000, "heldout": 500}  # strings per split


def make_rows(seed: int = 0) -> list[tuple[str, str]]:
    """(example, split) rows, training rows first; no string appears twice."""
    rng = np.random.default_rng(seed)
    numbers = rng.choice(10**DIGITS, size=sum(COUNTS.values()), replace=False)  # distinct
    strings = [f"{n:0{DIGITS}d}" for n in numbers.tolist()]
    splits = [split for split, n in COUNTS.items() for _ in range(n)]
    return [(f"{s}>{s[::-1]}", split) for s, split in zip(strings, splits)]


def render(rows) -> str:
    lines = ["example,split"] + [f"{example},{split}" for example, split in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = make_rows()
    CSV.parent.mkdir(exist_ok=True)
    CSV.write_text(render(rows))
    print(f"wrote {CSV.relative_to(ROOT)}: {len(rows)} rows")


if __name__ == "__main__":
    main()

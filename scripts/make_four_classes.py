"""Make `data/four_classes.csv`: the small 4-class dataset lesson 05b trains on.

Four Gaussian clouds in 2-D, centred on the corners of a square and overlapping enough that
a linear classifier cannot be perfect. 100 training and 50 validation points per class,
drawn from NumPy's PCG64 generator with a fixed seed, so the file is the same on every run:
`python -m scripts.make_four_classes` rewrites it byte for byte (a test of lesson 05b checks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "four_classes.csv"
CENTRES = [(1.0, 1.0), (-1.0, 1.0), (-1.0, -1.0), (1.0, -1.0)]  # class k sits at CENTRES[k]
SPREAD = 0.8  # standard deviation of each cloud: the clouds overlap
COUNTS = {"train": 100, "val": 50}  # points per class and split


def make_rows(seed: int = 0) -> list[tuple[float, float, int, str]]:
    """(x1, x2, label, split) rows, training rows first, classes interleaved."""
    rng = np.random.default_rng(seed)
    rows = []
    for split, n in COUNTS.items():
        labels = np.tile(np.arange(len(CENTRES)), n)  # 0, 1, 2, 3, 0, 1, ...
        points = np.array(CENTRES)[labels] + SPREAD * rng.standard_normal((len(labels), 2))
        rows += [(float(a), float(b), int(k), split) for (a, b), k in zip(points, labels)]
    return rows


def render(rows) -> str:
    """The CSV text: 6 decimals, enough for the lesson and stable to write and read."""
    lines = ["x1,x2,label,split"] + [f"{a:.6f},{b:.6f},{k},{s}" for a, b, k, s in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = make_rows()
    CSV.parent.mkdir(exist_ok=True)
    CSV.write_text(render(rows))
    print(f"wrote {CSV.relative_to(ROOT)}: {len(rows)} rows")


if __name__ == "__main__":
    main()

"""Lesson 04b exercises: batch indices, and a pad-and-mask collate.

Replace each `raise NotImplementedError` with your code, then run `make exercises N=04b`:
your batches are compared with PyTorch's samplers, and your padding with hand-made batches.
"""

from __future__ import annotations

import torch


def batch_indices(n: int, batch_size: int, shuffle: bool, drop_last: bool,
                  seed: int = 0) -> list[list[int]]:
    """One epoch of batches of the indices 0..n-1.

    The order is 0, 1, ..., n-1, or with `shuffle` the permutation
    `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` (what a
    `RandomSampler` with that generator yields: same seed, same order). Cut it into
    consecutive batches of `batch_size`; the last batch may be shorter, and is left out when
    `drop_last` is True. Every index appears at most once; with `drop_last=False`, exactly
    once. `n == 0` gives `[]`. Leave torch's global random state alone (no
    `torch.manual_seed`): a training loop calling this every epoch would otherwise have its
    dropout and initialisation stream reset each time.

    >>> batch_indices(5, 2, shuffle=False, drop_last=False)
    [[0, 1], [2, 3], [4]]
    >>> batch_indices(5, 2, shuffle=False, drop_last=True)
    [[0, 1], [2, 3]]
    """
    raise NotImplementedError("batch_indices")


def pad_collate(seqs, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a batch of token sequences to the longest one *in this batch*.

    `seqs` is a list of B sequences, each a 1-D integer tensor or a list of ints, possibly
    empty. Return `(tokens, mask)`:

    - `tokens`: int64, shape (B, L) with L the longest length in the batch (0 when every
      sequence is empty or B == 0); row i holds seqs[i] from the left, then `pad_id`;
    - `mask`: bool, shape (B, L), True exactly on the positions holding real tokens (even
      where a real token equals `pad_id`).

    >>> tokens, mask = pad_collate([[5, 6, 7], [8]], pad_id=0)
    >>> tokens.tolist(), mask.tolist()
    ([[5, 6, 7], [8, 0, 0]], [[True, True, True], [True, False, False]])
    """
    raise NotImplementedError("pad_collate")

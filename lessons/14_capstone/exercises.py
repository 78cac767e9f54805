"""Lesson 14 exercises: a learning-rate schedule, and a data order that survives a restart.
Check your answers with `make exercises N=14`."""

import math  # noqa: F401  (you will need it)

import torch


def lr_at(step, total, peak, warmup, floor=0.0):
    """The learning rate of training step `step` (1, 2, ..., total).

    A linear warm-up over the first `warmup` steps: peak * step / warmup, so step 1 has
    peak / warmup and step `warmup` has peak. Then a cosine decay from peak (at step
    `warmup`) to floor (at step `total`): half a cosine period, floor + (peak - floor) *
    (1 + cos(pi * progress)) / 2, where progress goes from 0 at step `warmup` to 1 at step
    `total`. With warmup = 0 the decay starts at step 0."""
    raise NotImplementedError


class Shuffler:
    """The rows of a dataset in a shuffled order, batch after batch, like
    `DataLoader(shuffle=True, drop_last=True)` (its pattern, not its exact numbers): every
    epoch is a new permutation of the n rows, drawn from one generator, and an epoch's last
    incomplete batch is dropped; `next()` returns the (size,) row indices of the
    next batch. The lesson's train.py uses it instead of gpt.batch_rows with
    `train.py DIR --shuffler exercises.py`, and puts the object into every DCP
    checkpoint (DCP calls its state_dict() on save and load_state_dict() on load)."""

    def __init__(self, n, size, seed=0):
        self.n, self.size = n, size
        self.gen = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(n, generator=self.gen)  # this epoch's order
        self.pos = 0  # batches of this epoch already used

    def next(self):
        if (self.pos + 1) * self.size > self.n:  # the epoch is used up: a new permutation
            self.order, self.pos = torch.randperm(self.n, generator=self.gen), 0
        rows = self.order[self.pos * self.size:(self.pos + 1) * self.size]  # (size,)
        self.pos += 1
        return rows

    def state_dict(self):
        """What load_state_dict needs to make next() continue exactly as this object would:
        tensors and plain values only (DCP saves them), none that changes when this object
        goes on drawing batches afterwards."""
        raise NotImplementedError

    def load_state_dict(self, sd):
        """Restore what state_dict returned, into an object made with any seed."""
        raise NotImplementedError

"""Lesson 04b's data pieces: everything its DataLoader worker processes run.

The dataset, the `collate_fn` and the `worker_init_fn` live here, in a module, not in the
lesson's cells. A worker started by *spawn* (the default on macOS and Windows) or by
*forkserver* (Linux's default from Python 3.14) is a fresh process: it receives them by
pickle, and pickle stores a class or a function as "module name, attribute name". A fresh
process can import `text_data` from this folder; it cannot find a function defined in a
notebook cell. Code written this way also works with *fork* (Linux's default up to Python
3.13), where a worker is a copy of the parent and nothing needs to be found again.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import random
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

PAD = 0  # token id 0 is padding; real words get 1..V


def encode(line, vocab):
    """The word ids of one line: an int64 tensor of shape (L,)."""
    return torch.tensor([vocab[w] for w in line.split()])


class Lines(Dataset):
    """Item i: {"idx": i, "ids": the word ids of line i (int64, variable length)}."""

    def __init__(self, lines, vocab):
        self.lines, self.vocab = lines, vocab

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        return {"idx": i, "ids": encode(self.lines[i], self.vocab)}


def collate(items):
    """items: dicts with "ids" (L_i,) -> tokens (B, L) int64, mask (B, L) bool, + other keys."""
    ids = [it["ids"] for it in items]
    tokens = nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=PAD)  # (B, L)
    lens = torch.tensor([len(s) for s in ids])  # (B,)
    mask = torch.arange(tokens.shape[1]) < lens[:, None]  # (B, L): True on real tokens
    rest = {k: [it[k] for it in items] for k in items[0] if k != "ids"}
    return {"tokens": tokens, "mask": mask, **rest}


class Noisy(Lines):
    """Lines that also report their worker, its torch seed, and three random draws: the
    dataset's own RNG, Python's `random`, NumPy's global RNG."""

    def __init__(self, lines, vocab):
        super().__init__(lines, vocab)
        self.rng = np.random.default_rng(0)  # created in the parent, copied into every worker
        self.seed = None  # set by worker_init_fn, if there is one

    def __getitem__(self, i):
        info = get_worker_info()  # None in the main process
        item = super().__getitem__(i)
        item.update(worker=info.id if info else -1, seed=self.seed, torch_seed=torch.initial_seed(),
                    own=int(self.rng.integers(100)), py=random.randrange(100),
                    glob=int(np.random.randint(100)))
        return item


def reseed(worker_id):
    """worker_init_fn: give the dataset's RNG the worker's own seed (differs per worker)."""
    info = get_worker_info()  # info.dataset is this worker's copy
    info.dataset.seed = info.seed  # base_seed + worker_id
    info.dataset.rng = np.random.default_rng(info.seed)


class LineStream(IterableDataset):
    """The corpus as a stream, in order. Each worker runs its own copy of __iter__; with
    shard=True, worker w of n keeps lines w, w + n, w + 2n, ..."""

    def __init__(self, lines, vocab, shard):
        self.lines, self.vocab, self.shard = lines, vocab, shard

    def __iter__(self):
        info = get_worker_info()  # None in the main process
        first, step = (info.id, info.num_workers) if self.shard and info else (0, 1)
        for i in range(first, len(self.lines), step):
            yield {"idx": i, "ids": encode(self.lines[i], self.vocab),
                   "worker": info.id if info else -1}


def start_method():
    """How this lesson starts workers: forkserver on Linux, spawn elsewhere; never fork."""
    if sys.platform.startswith("linux"):
        # The server imports torch once; the workers forked from it need not import it again.
        # A process-wide hint, read when the server starts; it only changes start-up time.
        multiprocessing.get_context("forkserver").set_forkserver_preload(["torch"])
        return "forkserver"
    return "spawn"


@contextlib.contextmanager
def main_script_hidden():
    """While workers start, make `__main__` look like a notebook's: no file, no module name.

    A spawn or forkserver worker first runs the main *script* again (as `__mp_main__`), to
    find what was defined there; a script protects its own work with
    `if __name__ == "__main__":`. `multiprocessing` decides what to run again from
    `__main__.__spec__` and `__main__.__file__`, read when it starts each process; a
    notebook has neither, so nothing runs again. The lesson is a script and a notebook at
    once, and a guard cannot span notebook cells: its workers need nothing from `__main__`,
    so while they start, the file is hidden. A shortcut for this lesson; a training script
    of your own uses the guard.
    """
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)


def batches(loader, count=None):
    """The first `count` batches of a loader (all when None); workers start in iter()."""
    with main_script_hidden():
        it = iter(loader)
    return list(itertools.islice(it, count))


KEYS = ("worker", "idx", "own", "py", "glob", "seed", "torch_seed")  # what a Noisy batch reports


def noisy_loader(lines, vocab, init=None, seed=0, context=None, persistent=False):
    """A 2-worker shuffled loader over Noisy, batches of 3, its generator seeded."""
    return DataLoader(Noisy(lines, vocab), batch_size=3, shuffle=True, num_workers=2,
                      collate_fn=collate, worker_init_fn=init, persistent_workers=persistent,
                      generator=torch.Generator().manual_seed(seed),
                      multiprocessing_context=context or start_method())


def run_loader(lines, vocab, init=None, seed=0, count=4, context=None):
    """The first batches of noisy_loader, as dicts of plain lists."""
    loader = noisy_loader(lines, vocab, init, seed, context)
    return [{k: b[k] for k in KEYS} for b in batches(loader, count)]


def first_draws_per_epoch(lines, vocab, persistent, epochs=2):
    """The own-RNG draws of each epoch's first batch, every epoch read to its end."""
    loader = noisy_loader(lines, vocab, persistent=persistent)
    return [batches(loader)[0]["own"] for _ in range(epochs)]


def run_stream(lines, vocab, shard, context=None):
    """Every batch of a 2-worker loader over LineStream: [(worker, indices), ...]."""
    loader = DataLoader(LineStream(lines, vocab, shard), batch_size=4, num_workers=2,
                        collate_fn=collate, multiprocessing_context=context or start_method())
    return [(b["worker"][0], b["idx"]) for b in batches(loader)]


class ThreadCount(Dataset):
    """Item i: (the worker's id, torch's intra-op threads in that worker)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = get_worker_info()  # None in the main process
        return info.id if info else -1, torch.get_num_threads()


def worker_threads(num_workers=2, context=None):
    """{worker id: torch.get_num_threads() inside that worker}, from a loader over ThreadCount."""
    loader = DataLoader(ThreadCount(), batch_size=None, num_workers=num_workers,
                        generator=torch.Generator().manual_seed(0),  # leaves the global RNG alone
                        multiprocessing_context=context or start_method())
    return dict(batches(loader))

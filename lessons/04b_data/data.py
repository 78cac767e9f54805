# %% [markdown]
# # 04b · Data: how a DataLoader makes reproducible batches
#
# A `DataLoader` is a sampler that picks indices, a `collate_fn` that glues items into a
# batch, and optionally worker processes that each hold a copy of your dataset. This
# lesson, the second part of lesson 04, opens each piece up on a small text corpus: the
# order of an epoch, padding and masks, how workers start and are seeded, how many batches
# are in flight, and the switches that make two runs give the same batches.
#
# **What you will learn**
#
# - how a DataLoader orders and batches (`SequentialSampler`, `RandomSampler`, `batch_size`,
#   `drop_last`), and how a `collate_fn` pads and masks variable-length token sequences;
# - how its worker processes start (fork, spawn, forkserver), why a script needs
#   `if __name__ == "__main__":`, how workers are seeded, and how to make two runs give the
#   same batches;
# - how an `IterableDataset` must split itself among workers;
# - how many batches are in flight (`num_workers`, `prefetch_factor`), how workers share the
#   machine's CPUs with torch's threads, what `pin_memory` does, and where resumable loading
#   lives;
# - the reproducibility switches beyond seeding (deterministic kernels, cuDNN, cuBLAS).
#
# **Prerequisites:** lesson 04a, which this part follows: modules, and `train()` mode, in
# which BatchNorm normalises with the batch's own statistics. Nothing about Python's
# `multiprocessing` is assumed.
#
# **How to run:** `python lessons/04b_data/data.py` or `make lesson N=04b` from the
# repository root, or open `data.ipynb`. It runs on the CPU in seconds, including
# DataLoader worker processes. It reads the small corpus `data/tiny_corpus.txt` of the
# course repository (or a copy of that file placed in this folder). Each printing cell is
# followed by an *Output* block: what it printed with the pinned PyTorch (2.13.0).

# %%
import os
import random
import re
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

# The dataset, collate_fn and worker_init_fn that DataLoader workers run (section 3 says why
# they live in a module of this folder)
from text_data import (Lines, LineStream, collate, first_draws_per_epoch, main_script_hidden, reseed,
                       run_loader, run_stream, start_method, worker_threads)

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()


# %% [markdown]
# ## 1. A corpus, a sampler, batches
#
# The course ships a small corpus written for it: `data/tiny_corpus.txt`, 32 short
# sentences, one per line. The lesson looks for it in the repository's `data/` folder, then
# in the lesson's own folder (in case you copied only this folder: copy the file next to the
# lesson). If neither exists it stops with a message that says so, rather than quietly
# using other text: every printed number below depends on that file.
#
# The dataset, and the `collate_fn` of the next section, live in `text_data.py` in this
# folder, for a reason section 3 explains (worker processes must be able to import them).
# The dataset is the smallest map-style one: a length, and item `i` on request.
#
# ```python
# class Lines(Dataset):
#     """Item i: {"idx": i, "ids": the word ids of line i (int64, variable length)}."""
#
#     def __init__(self, lines, vocab):
#         self.lines, self.vocab = lines, vocab
#
#     def __len__(self):
#         return len(self.lines)
#
#     def __getitem__(self, i):
#         return {"idx": i, "ids": encode(self.lines[i], self.vocab)}
# ```
#
# `encode(line, vocab)` looks up each word's id: `torch.tensor([vocab[w] for w in line.split()])`.


# %%
def load_lines(name="tiny_corpus.txt"):
    """The corpus lines, from <repo>/data/ or from the lesson folder."""
    places = [HERE.parent.parent / "data" / name, HERE / name]
    for path in places:
        if path.is_file():
            return [ln for ln in path.read_text().splitlines() if ln.strip()]  # one per line
    raise FileNotFoundError(f"{name} not found in {[str(p) for p in places]}: copy "
                            f"data/{name} from the course repository next to this lesson")


lines = load_lines()
words = Counter(w for line in lines for w in line.split())
vocab = {w: k + 1 for k, w in enumerate(sorted(words))}  # sorted: ids do not depend on order; 0 is PAD
ds = Lines(lines, vocab)
lengths = [len(ds[i]["ids"]) for i in range(len(ds))]
print(f"{len(ds)} lines, {sum(lengths)} tokens, vocabulary {len(vocab)} words + pad")
print(f"lengths min {min(lengths)} max {max(lengths)}; line 0 {ds[0]['ids'].tolist()}")

# %% [markdown]
# Output:
# ```text
# 32 lines, 237 tokens, vocabulary 171 words + pad
# lengths min 4 max 9; line 0 [151, 70, 130, 16, 151, 150, 68, 117]
# ```
#
# Word-level tokens, a sorted vocabulary, id 0 reserved for padding. Sentences have
# different lengths, so items cannot simply be stacked into one tensor.
#
# **Predict.** A sampler yields indices. What do `SequentialSampler` and a
# `RandomSampler` with a seeded `torch.Generator` yield? Does the random one repeat itself
# when iterated again with a freshly seeded generator?

# %%
seq = list(SequentialSampler(ds))
rand_a = list(RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
rand_b = list(RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
print(f"sequential {seq[:10]} ...")
print(f"random     {rand_a[:10]} ...")
print(f"same seed, same order: {rand_a == rand_b}; a permutation: {sorted(rand_a) == seq}")
print(f"DataLoader(shuffle=True) samples with a {type(DataLoader(ds, shuffle=True).sampler).__name__}")

# %% [markdown]
# Output:
# ```text
# sequential [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ...
# random     [12, 31, 25, 28, 19, 29, 9, 10, 6, 27] ...
# same seed, same order: True; a permutation: True
# DataLoader(shuffle=True) samples with a RandomSampler
# ```
#
# `shuffle=True` in a DataLoader means a `RandomSampler`: one `torch.randperm(n)` per epoch,
# drawn from the loader's `generator` (or from a seed drawn from the global RNG when you
# give none). Every index appears exactly once per epoch.
#
# **Predict.** With 32 items and `batch_size=10`, how many batches, of which sizes, with
# and without `drop_last`?

# %%
for drop_last in (False, True):
    loader = DataLoader(ds, batch_size=10, drop_last=drop_last, collate_fn=lambda items: items)
    sizes = [len(b) for b in loader]
    print(f"drop_last={drop_last!s:<5} len(loader) {len(loader)}  batch sizes {sizes}")
try:
    nn.BatchNorm1d(4)(torch.randn(1, 4))  # a last batch of 1, in training mode
except ValueError as err:
    print(f"BatchNorm1d on a batch of 1: {err}")

# %% [markdown]
# Output:
# ```text
# drop_last=False len(loader) 4  batch sizes [10, 10, 10, 2]
# drop_last=True  len(loader) 3  batch sizes [10, 10, 10]
# BatchNorm1d on a batch of 1: Expected more than 1 value per channel when training, got input size torch.Size([1, 4])
# ```
#
# The `BatchSampler` cuts the sampler's order into chunks of `batch_size`. The last short
# chunk is kept unless `drop_last=True`. Training code drops it when a short batch would
# hurt: a last batch of one item makes BatchNorm raise in training mode (its batch variance
# needs two values), and a short batch is a new shape for a compiled graph (lesson 08a).
# Here the `collate_fn` returns the list of items unchanged, to see the batch sizes.

# %% [markdown]
# ## 2. Pad and mask: a `collate_fn` for variable-length sequences
#
# The default `collate_fn` stacks tensors, which fails for different lengths. Ours pads each
# batch to its *own* longest sequence with `PAD` (0), and returns a boolean mask that is
# True on real tokens (attention and the loss use it to ignore the padding):
#
# ```python
# def collate(items):
#     """items: dicts with "ids" (L_i,) -> tokens (B, L) int64, mask (B, L) bool, + other keys."""
#     ids = [it["ids"] for it in items]
#     tokens = nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=PAD)  # (B, L)
#     lens = torch.tensor([len(s) for s in ids])  # (B,)
#     mask = torch.arange(tokens.shape[1]) < lens[:, None]  # (B, L): True on real tokens
#     rest = {k: [it[k] for it in items] for k in items[0] if k != "ids"}
#     return {"tokens": tokens, "mask": mask, **rest}
# ```
#
# **Predict.** For the first batch of 4 lines (lengths 8, 9, 7, 6), what are the shapes of
# `tokens` and `mask`, and how many values are padding?

# %%
try:
    next(iter(DataLoader(ds, batch_size=4)))  # the default collate_fn
except RuntimeError as err:
    print(f"default collate_fn: {str(err).split(',')[0]}")
batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate)))
tokens, mask = batch["tokens"], batch["mask"]
print(f"tokens {tuple(tokens.shape)} {tokens.dtype}, mask {tuple(mask.shape)} {mask.dtype}")
print(f"lengths {mask.sum(1).tolist()}, padding {(~mask).sum().item()} of {mask.numel()}")
for row, m in zip(tokens.tolist(), mask.int().tolist()):
    print(f"{str(row):<42} {''.join(map(str, m))}")
widths = [b["tokens"].shape[1] for b in DataLoader(ds, batch_size=4, collate_fn=collate)]
print(f"padded length of each of the {len(widths)} batches: {widths}")


def padding(batches):
    """Pad tokens in an epoch of collated batches."""
    return sum((~b["mask"]).sum().item() for b in batches)


by_length = sorted(range(len(ds)), key=lambda i: lengths[i])  # indices, shortest line first
sorted_batches = [collate([ds[i] for i in by_length[k : k + 4]]) for k in range(0, len(ds), 4)]
pad_as_is = padding(DataLoader(ds, batch_size=4, collate_fn=collate))
print(f"padding in the epoch: {pad_as_is} tokens; with the lines sorted by length: {padding(sorted_batches)}")

# %% [markdown]
# Output:
# ```text
# default collate_fn: stack expects each tensor to be equal size
# tokens (4, 9) torch.int64, mask (4, 9) torch.bool
# lengths [8, 9, 7, 6], padding 6 of 36
# [151, 70, 130, 16, 151, 150, 68, 117, 0]   111111110
# [1, 134, 20, 158, 23, 151, 58, 61, 159]    111111111
# [116, 149, 100, 151, 167, 6, 93, 0, 0]     111111100
# [151, 12, 31, 80, 11, 36, 0, 0, 0]         111111000
# padded length of each of the 8 batches: [9, 8, 9, 9, 8, 7, 9, 9]
# padding in the epoch: 35 tokens; with the lines sorted by length: 11
# ```
#
# Each batch is as long as its own longest line, not as the longest line of the corpus
# (last line but one): a batch of short lines costs less. Sorting lines by length before
# batching cuts the padding further (last line). Sorted batches are no longer random, so a
# training loader shuffles within and across *buckets* of similar lengths instead. The mask is
# computed from the lengths, not from `tokens != PAD`, so a real token that happens to have
# the pad id would still count.

# %% [markdown]
# ## 3. Worker processes and their random state
#
# With `num_workers=2` the DataLoader starts two processes each time you iterate it. Worker
# `w` builds whole batches (batch `k` goes to worker `k % 2`) and sends them back through a
# queue. Before its first batch, the loader seeds each worker from `base_seed + w`: that
# number is the worker's `get_worker_info().seed`; torch's generator and Python's `random`
# are seeded with it, NumPy's global RNG with a seed mixed from the same two numbers.
# `base_seed` is drawn from the loader's `generator` when the iterator is created.
#
# How a worker process starts is the *start method* of Python's `multiprocessing`:
#
# - **fork**: a copy of the parent at that moment. Fast, but only the thread that forked
#   exists in the copy; if another thread held a lock then, the child may wait for it
#   forever, and processes that run several threads are common (a notebook kernel does).
# - **spawn**: a fresh Python process that imports torch, then receives the dataset,
#   `collate_fn` and `worker_init_fn` by pickle. Pickle stores a class or function by
#   module and name, so they must live in an importable module, not in a notebook cell.
#   And the fresh process first runs the main *script* again, as the module
#   `__mp_main__`, to find what was defined there.
# - **forkserver**: a server process, started once, fresh like spawn, that forks each
#   worker from itself; each worker then runs the main script again, as under spawn. The
#   same rules as spawn; but with `set_forkserver_preload(["torch"])` (what
#   `text_data.start_method` does) the server imports torch once, and the workers need not
#   import it again.
#
# Linux's default is fork up to Python 3.13 (from 3.12, Python warns when a process that
# runs other threads forks) and forkserver from 3.14; macOS and Windows use spawn.
#
# **Predict.** A six-line script starts one child process by spawn, without and with
# `if __name__ == "__main__":` around its work. What does each print?


# %%
SPAWNING = """import multiprocessing
{guard}ctx = multiprocessing.get_context("spawn")
{indent}p = ctx.Process(target=print, args=("child ran",))
{indent}p.start()
{indent}p.join()
{indent}print("exit code", p.exitcode)
"""


def run_spawning(guarded):
    """Run SPAWNING as a script in a fresh Python: (stdout lines, the child's error, if any)."""
    guard, indent = ('if __name__ == "__main__":\n    ', "    ") if guarded else ("", "")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "spawning.py"
        script.write_text(SPAWNING.format(guard=guard, indent=indent))
        # PYTHON_COLORS=0: a notebook's kernel sets FORCE_COLOR, and Python 3.13 then colours
        # tracebacks, which would hide the "RuntimeError:" this function looks for
        env = {**os.environ, "PYTHON_COLORS": "0"}
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, env=env)
    _, raised, message = proc.stderr.partition("RuntimeError:")  # the child's traceback, if any
    error = " ".join(message.split()).split(". ")[0] if raised else None  # its first sentence
    return proc.stdout.splitlines(), error


spawned = {guarded: run_spawning(guarded) for guarded in (False, True)}
for guarded, (out, error) in spawned.items():
    print(f"{'guarded' if guarded else 'unguarded'}: prints {out}")
    if error:
        print(f"  the child: RuntimeError: {error}")

# %% [markdown]
# Output:
# ```text
# unguarded: prints ['exit code 1']
#   the child: RuntimeError: An attempt has been made to start a new process before the current process has finished its bootstrapping phase
# guarded: prints ['child ran', 'exit code 0']
# ```
#
# Without the guard, the child ran the script again up to `p.start()`, and a child may not
# start children of its own while it is still being set up: it raised, and exited with 1.
# With the guard, the child skipped the script's work, ran its target and exited with 0.
# A DataLoader in an unguarded script fails the same way under spawn or forkserver: every
# worker would run the whole script again and die in its `iter(loader)`.
#
# This lesson starts its workers through `text_data.py` (forkserver on Linux, spawn
# elsewhere) and, being a notebook too, cannot use the guard; that file's docstrings say
# how. In your own training script, write the guard.
#
# A random generator that the dataset created in `__init__` is copied, state and all, into
# every worker (by fork, or by pickle), and nobody reseeds it. `Noisy` draws a random
# "augmentation" number per item three times: from its own NumPy generator, created once
# with seed 0, from Python's `random` and from NumPy's global RNG:
#
# ```python
#     def __getitem__(self, i):
#         info = get_worker_info()  # None in the main process
#         item = super().__getitem__(i)
#         item.update(worker=info.id if info else -1, seed=self.seed, torch_seed=torch.initial_seed(),
#                     own=int(self.rng.integers(100)), py=random.randrange(100),
#                     glob=int(np.random.randint(100)))
#         return item
# ```
#
# **Predict.** A shuffled loader over `Noisy`, 2 workers, batches of 3, its generator
# seeded 0, no `worker_init_fn`. Which batches will carry the same draws?


# %%
def show(batches):
    for b in batches:
        print(f"worker {b['worker'][0]}  indices {str(b['idx']):<13} own rng {str(b['own']):<13} "
              f"random {str(b['py']):<13} np.random {b['glob']}")


run_0 = run_loader(lines, vocab)  # no worker_init_fn
show(run_0)
print(f"own rng, first batch, generator seed 1: {run_loader(lines, vocab, seed=1, count=1)[0]['own']}")

# %% [markdown]
# Output:
# ```text
# worker 0  indices [21, 15, 1]   own rng [85, 63, 51]  random [27, 35, 7]   np.random [10, 41, 50]
# worker 1  indices [9, 31, 2]    own rng [85, 63, 51]  random [98, 20, 82]  np.random [23, 74, 37]
# worker 0  indices [23, 5, 13]   own rng [26, 30, 4]   random [5, 81, 40]   np.random [70, 75, 83]
# worker 1  indices [18, 12, 6]   own rng [26, 30, 4]   random [59, 92, 24]  np.random [65, 62, 79]
# own rng, first batch, generator seed 1: [85, 63, 51]
# ```
#
# The dataset's own generator gives worker 1 exactly the draws of worker 0: both received
# the same generator state, so half of the "random" augmentations are duplicates. It is
# worse: every new set of workers receives a fresh copy of the parent's untouched
# generator, so every epoch, and every generator seed, repeats the same draws (last line).
# Python's `random` and NumPy's global RNG, on the other hand, differ per worker: the
# loader seeds both in each worker. Many older texts and posts still say that every worker
# inherits the same NumPy seed; in 2.13.0 that holds for generator objects you made
# yourself, and for libraries the loader does not know about.
#
# The order of indices also differs from the bare `RandomSampler` above, with the same seed
# 0: the loader first draws `base_seed` from the generator, then the sampler draws its
# permutation from what follows.
#
# The fix is a `worker_init_fn`, which the loader calls in each worker before its first
# item:
#
# ```python
# def reseed(worker_id):
#     """worker_init_fn: give the dataset's RNG the worker's own seed (differs per worker)."""
#     info = get_worker_info()  # info.dataset is this worker's copy
#     info.dataset.seed = info.seed  # base_seed + worker_id
#     info.dataset.rng = np.random.default_rng(info.seed)
# ```
#
# **Predict.** The same loader with `worker_init_fn=reseed`, run twice with the generator
# seeded 0, and once seeded 1. Do the draws still repeat across workers? Are the two seed-0
# runs equal?


# %%
def replays_random(batches):
    """Are each worker's Python `random` draws those of random.Random(its torch seed)?"""
    ok = True
    for w in {b["worker"][0] for b in batches}:
        mine = [b for b in batches if b["worker"][0] == w]
        draws = [d for b in mine for d in b["py"]]
        rng = random.Random(mine[0]["torch_seed"][0])
        ok = ok and draws == [rng.randrange(100) for _ in draws]
    return ok


run_a, run_b = run_loader(lines, vocab, init=reseed), run_loader(lines, vocab, init=reseed)
show(run_a)
print(f"worker seeds {sorted({(b['worker'][0], b['seed'][0]) for b in run_a})}")
print(f"inside each worker, torch.initial_seed() is that seed: "
      f"{all(b['torch_seed'] == b['seed'] for b in run_a)}; Python's random starts from it: "
      f"{replays_random(run_a)}")
print(f"two runs, generator seed 0: same batches {run_a == run_b}")
print(f"generator seed 1: same batches {run_loader(lines, vocab, init=reseed, seed=1) == run_a}")

# %% [markdown]
# Output:
# ```text
# worker 0  indices [21, 15, 1]   own rng [52, 77, 52]  random [27, 35, 7]   np.random [10, 41, 50]
# worker 1  indices [9, 31, 2]    own rng [24, 65, 8]   random [98, 20, 82]  np.random [23, 74, 37]
# worker 0  indices [23, 5, 13]   own rng [64, 84, 35]  random [5, 81, 40]   np.random [70, 75, 83]
# worker 1  indices [18, 12, 6]   own rng [26, 81, 93]  random [59, 92, 24]  np.random [65, 62, 79]
# worker seeds [(0, 900450186894289455), (1, 900450186894289456)]
# inside each worker, torch.initial_seed() is that seed: True; Python's random starts from it: True
# two runs, generator seed 0: same batches True
# generator seed 1: same batches False
# ```
#
# `reseed` replaced the copied generator with one seeded from `info.seed`, which is
# `base_seed + worker_id`: the two workers' seeds differ by one, so their draws differ.
# Because `base_seed` comes from the loader's seeded `generator`, a second run repeats every
# index and every draw, and another seed changes them. The recipe: give the loader a seeded
# `torch.Generator`, and seed every other random source in `worker_init_fn` from
# `get_worker_info().seed` (inside a worker, `torch.initial_seed()` returns the same
# number). None of this depends on the start method: a worker started by fork, spawn or
# forkserver runs the same seeding in `_worker_loop`, before its first item (read from
# `torch/utils/data/_utils/worker.py`).
#
# **Predict.** Without a `worker_init_fn`, every epoch repeated the dataset's own draws,
# because every epoch started new workers. With `persistent_workers=True` the workers
# survive from one epoch to the next. What do the first batches of two epochs draw then?


# %%
for persistent in (False, True):
    draws = first_draws_per_epoch(lines, vocab, persistent)
    print(f"persistent_workers={persistent!s:<5}: own rng of each epoch's first batch {draws}")

# %% [markdown]
# Output:
# ```text
# persistent_workers=False: own rng of each epoch's first batch [[85, 63, 51], [85, 63, 51]]
# persistent_workers=True : own rng of each epoch's first batch [[85, 63, 51], [54, 55, 93]]
# ```
#
# New workers each epoch start again from the copied generator; persistent workers keep
# their copy, which moves on. Persistence changes when the copies restart, not that the
# workers' copies start out equal: the `worker_init_fn` remains the fix.

# %% [markdown]
# ## 4. Iterable datasets: every worker runs the whole stream
#
# A map-style dataset answers "item `i`?", and the sampler in the main process decides which
# `i` goes to which worker. An `IterableDataset` (a stream: lines read from files, records
# from a network) has only `__iter__`, and each worker runs its own copy of it from the
# start. `get_worker_info()` tells the copy which worker it runs in (`id`) and how many
# there are (`num_workers`); `LineStream` shards on them when asked:
#
# ```python
#     def __iter__(self):
#         info = get_worker_info()  # None in the main process
#         first, step = (info.id, info.num_workers) if self.shard and info else (0, 1)
#         for i in range(first, len(self.lines), step):
#             yield {"idx": i, "ids": encode(self.lines[i], self.vocab),
#                    "worker": info.id if info else -1}
# ```
#
# **Predict.** A 2-worker loader, batches of 4, over the 32 lines, without and with
# `shard=True`. How many batches and items, and which lines does each batch hold?

# %%
streams = {}  # shard -> [(worker, indices), ...] for every batch
for shard in (False, True):
    streams[shard] = run_stream(lines, vocab, shard=shard)
    seen = Counter(i for _, idx in streams[shard] for i in idx)
    print(f"shard={shard}: {len(streams[shard])} batches, {sum(seen.values())} items for "
          f"{len(lines)} lines; each line seen {sorted(set(seen.values()))} time(s)")
    print("  " + ", ".join(f"worker {w} {idx}" for w, idx in streams[shard][:3]))
try:
    DataLoader(LineStream(lines, vocab, shard=True), batch_size=4, shuffle=True)
except ValueError as err:
    print(f"shuffle=True: {err}")

# %% [markdown]
# Output:
# ```text
# shard=False: 16 batches, 64 items for 32 lines; each line seen [2] time(s)
#   worker 0 [0, 1, 2, 3], worker 1 [0, 1, 2, 3], worker 0 [4, 5, 6, 7]
# shard=True: 8 batches, 32 items for 32 lines; each line seen [1] time(s)
#   worker 0 [0, 2, 4, 6], worker 1 [1, 3, 5, 7], worker 0 [8, 10, 12, 14]
# shuffle=True: DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle=True
# ```
#
# Unless the stream splits itself, `num_workers=2` reads everything twice: without
# sharding, an epoch holds every line twice, and nothing warns you. Each duplicate batch is
# one more step on data the model has just seen. With sharding, worker `w` keeps lines
# `w, w + 2, w + 4, ...` and the two workers together read each line once. The loader
# still takes batches from the workers in turn, so the order of an epoch is interleaved,
# not the file's order. For a stream, batches are built inside each worker and the loader
# refuses `shuffle` (there is no index to shuffle): any shuffling (a buffer, shuffled
# shards) is the dataset's own job.

# %% [markdown]
# ## 5. Batches in flight: `num_workers`, `prefetch_factor`, `pin_memory`
#
# With workers, the main process does not wait for a batch to be asked for: it hands the
# workers batches of indices ahead of time, so that while it runs your training step, the
# workers prepare the next batches; the argument `prefetch_factor` sets how far ahead.
# With `num_workers=0` there are no workers: each batch is built in the main process when
# you ask for it.
#
# **Predict.** A batch sampler counts how many batches of indices the loader has taken
# from it. How many right after `iter(loader)`, and after the first batch, with 0 workers,
# with 2 workers and the default `prefetch_factor`, and with 2 workers and
# `prefetch_factor=4`?


# %%
class CountingBatches:
    """Batches of 2 consecutive indices, counting how many the loader has taken. It runs in
    the main process only (workers receive indices, not the sampler), so it may live here."""

    def __init__(self, n, size=2):
        self.batches, self.taken = [list(range(i, min(i + size, n))) for i in range(0, n, size)], 0

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for b in self.batches:
            self.taken += 1
            yield b


def taken(num_workers, prefetch_factor):
    """(batches taken when iter() returns, batches taken after the first batch arrived)"""
    sampler = CountingBatches(len(ds))
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers,
                        prefetch_factor=prefetch_factor,
                        multiprocessing_context=start_method() if num_workers else None)
    with main_script_hidden():
        it = iter(loader)  # workers start here
    at_iter = sampler.taken
    next(it)
    del it  # shuts the workers down
    return at_iter, sampler.taken


for workers, prefetch in [(0, None), (2, None), (2, 4)]:
    at_iter, after_first = taken(workers, prefetch)
    print(f"num_workers {workers}, prefetch_factor {prefetch or 'default'}: batches taken at iter() "
          f"{at_iter}, after the first batch {after_first}")
try:
    DataLoader(ds, num_workers=0, prefetch_factor=2)
except ValueError as err:
    print(f"prefetch_factor with num_workers=0: {err}")

# %% [markdown]
# Output:
# ```text
# num_workers 0, prefetch_factor default: batches taken at iter() 0, after the first batch 1
# num_workers 2, prefetch_factor default: batches taken at iter() 4, after the first batch 5
# num_workers 2, prefetch_factor 4: batches taken at iter() 8, after the first batch 9
# prefetch_factor with num_workers=0: prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.
# ```
#
# As soon as the iterator exists, the loader hands each worker `prefetch_factor` batches
# of indices (2 by default), and every time it receives a batch it hands out one more: so
# `num_workers × prefetch_factor` batches are in flight at any time, that many batches'
# worth of memory, and that much work done ahead. Workers are worth their cost when
# building batches is slow (decoding images, tokenizing on the fly): each one is a process
# with a copy of the dataset and its batches in flight.
#
# How many workers, then? They share the machine's CPUs with the main process, which runs
# your training step on `torch.get_num_threads()` intra-op threads of its own (a process
# that never calls `torch.set_num_threads` picks a default from the machine; this lesson
# set 1). Two numbers describe the CPUs: `os.cpu_count()`, all the machine has, and
# `len(os.sched_getaffinity(0))`, those this process may run on (not on macOS or Windows).
# A cpuset (`taskset`, a job scheduler, `docker --cpuset-cpus`) may allow fewer; a CPU
# quota such as `docker --cpus` does not show here.
#
# **Predict.** The main process switches to 3 threads and starts a loader with 2 workers.
# What does `torch.get_num_threads()` return inside each worker? And what does the
# `DataLoader` constructor do when `num_workers` exceeds the CPUs this process may use?
# (Both are guesses: nothing so far says.)

# %%
usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"CPUs this process may use <= CPUs of the machine: {usable <= os.cpu_count()}")
torch.set_num_threads(3)
try:
    threads_in_workers = worker_threads()  # {worker id: torch.get_num_threads() inside it}
    print(f"main process: {torch.get_num_threads()} intra-op threads; inside each of its 2 workers: "
          f"{threads_in_workers}")
finally:
    torch.set_num_threads(1)  # back to the lesson's one thread
too_many = {}  # extra workers -> the warnings the constructor raised
for extra in (0, 1):
    with warnings.catch_warnings(record=True) as too_many[extra]:
        warnings.simplefilter("always")  # record each warning, even one seen before
        DataLoader(ds, num_workers=usable + extra)  # no worker starts here: iter() starts them
    said = [re.search(r"suggested max number of worker in current system is (\d+)", str(w.message))
            for w in too_many[extra]]
    print(f"num_workers = usable CPUs + {extra}: "
          + (", ".join(f"{w.category.__name__}, its suggested maximum is the usable CPUs: "
                       f"{bool(m) and int(m[1]) == usable}" for w, m in zip(too_many[extra], said))
             or "no warning"))

# %% [markdown]
# Output:
# ```text
# CPUs this process may use <= CPUs of the machine: True
# main process: 3 intra-op threads; inside each of its 2 workers: {0: 1, 1: 1}
# num_workers = usable CPUs + 0: no warning
# num_workers = usable CPUs + 1: UserWarning, its suggested maximum is the usable CPUs: True
# ```
#
# Each worker runs torch on one thread, whatever the main process uses: before its first
# item, `_worker_loop` calls `torch.set_num_threads(1)` (read from
# `torch/utils/data/_utils/worker.py`). It sets nothing else: NumPy, an image decoder or a
# tokenizer library inside your dataset keeps its own thread defaults, which you set in
# `worker_init_fn` or through their environment variables (a comment in
# `check_worker_number_rationality`, `torch/utils/data/dataloader.py`, says so). That
# function is the warning you saw: it compares `num_workers` with the CPUs this process may
# use (`sched_getaffinity`, or `os.cpu_count()` where that does not exist), when the loader
# is built and again when it starts workers. It counts only this loader's workers: with one
# training process per GPU, each process starts its own. So count the CPUs a step needs:
# the workers, plus the main process's threads, in every process on the machine. Beyond the
# usable CPUs, processes take turns on the same cores, and loading gets slower, not faster.

# %% [markdown]
# The last step of a batch's journey is the copy to the GPU. A CPU tensor normally lives
# in *pageable* memory, which the operating system may move or swap; the GPU's copy engine
# can only read *pinned* (page-locked) memory, so a copy from pageable memory first goes
# through a pinned staging buffer, and the CPU waits for it. `pin_memory=True` makes the
# loader put each batch in pinned memory itself; then
# `batch.to("cuda", non_blocking=True)` can return at once while the copy proceeds, and
# overlap with the GPU's work (lesson 06b; unverified on a GPU).
#
# **Predict.** Does `pin_memory=True` give pinned batches on your machine? On one without
# a GPU?

# %%
pinned_batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate, pin_memory=True)))
is_pinned = pinned_batch["tokens"].is_pinned()
print(f"pin_memory=True: tokens in pinned memory exactly when a CUDA GPU is present: "
      f"{is_pinned == torch.cuda.is_available()}")

# %% [markdown]
# Output:
# ```text
# pin_memory=True: tokens in pinned memory exactly when a CUDA GPU is present: True
# ```
#
# Pinned memory is allocated through an accelerator's driver. Without one (a CPU-only
# machine), the loader warns on stderr ("'pin_memory' argument is set as true but no
# accelerator is found, then device pinned memory won't be used") and returns ordinary
# tensors; a Mac's MPS backend gets a warning of its own and no pinning either (read from
# `_BaseDataLoaderIter.__init__` in `torch/utils/data/dataloader.py`). With a CUDA GPU the
# batch comes back pinned (unverified on a GPU).
#
# One thing a `DataLoader` cannot do is resume in the middle of an epoch. A job restarted
# from a checkpoint then starts the epoch again, seeing some batches twice, or must skip
# ahead by hand.
#
# **Predict.** Does a `DataLoader` have a `state_dict()`, as a module and an optimizer do?

# %%
print(f"torch.utils.data.DataLoader has state_dict: {hasattr(DataLoader, 'state_dict')}, "
      f"load_state_dict: {hasattr(DataLoader, 'load_state_dict')}")

# %% [markdown]
# Output:
# ```text
# torch.utils.data.DataLoader has state_dict: False, load_state_dict: False
# ```
#
# Resumable loading lives in a separate package, torchdata (not installed with the course,
# and not run here): its `StatefulDataLoader`, from `torchdata.stateful_dataloader`, is a
# drop-in replacement for `DataLoader` that adds `state_dict()` and `load_state_dict()`.
# By default its state records how many batches were yielded, and loading it fast-forwards
# the sampler (map-style) or the dataset (iterable-style) that far; a sampler or dataset
# with `state_dict` / `load_state_dict` methods of its own is saved and restored through
# them, each worker's part included. It does not coordinate ranks: each process saves its
# own loader's state, next to its model and optimizer state (lesson 12a checkpoints a run).


# %% [markdown]
# ## 6. Reproducibility switches
#
# `torch.manual_seed(s)` seeds the default generator of the CPU (and of every GPU;
# unverified on a GPU): parameter initialisation, dropout masks, `randperm`, and the
# `base_seed` of loaders that have no generator of their own.
# `torch.use_deterministic_algorithms(True)` is a different switch: it makes ops that have
# a nondeterministic implementation either use a deterministic one or raise an error.
#
# **Predict.** Does the same seed give the same initial weights, and the same order from a
# shuffled loader without a generator? The rest is a guess, since nothing so far says:
# under the switch, does an accumulating `index_put_` (two additions to the same cell, an
# op the documentation lists as nondeterministic on CPU) still run? And `put_`, which
# writes values at flat indices (if an index repeats, which write wins), or with
# `accumulate=True` adds them? What does `torch.empty` contain?

# %%
torch.manual_seed(0)
w1 = nn.Linear(3, 2).weight.detach().clone()
order_1 = [b["idx"] for b in DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate)]
torch.manual_seed(0)
w2 = nn.Linear(3, 2).weight.detach().clone()
order_2 = [b["idx"] for b in DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate)]
print(f"same seed: same init {torch.equal(w1, w2)}, same loader order {order_1 == order_2}")
torch.use_deterministic_algorithms(True)
try:
    idx = torch.tensor([0, 0, 2])  # cell 0 receives two additions
    acc = torch.zeros(3).index_put_((idx,), torch.ones(3), accumulate=True)  # (3,)
    print(f"deterministic mode {torch.are_deterministic_algorithms_enabled()}: "
          f"index_put_ {acc.tolist()}")
    try:
        torch.zeros(3).put_(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))  # no index repeats
    except RuntimeError as err:
        print(f"put_ at indices [0, 2]: {str(err).split(', but')[0]}")
    put_acc = torch.zeros(3).put_(idx, torch.ones(3), accumulate=True)  # (3,): adds instead
    print(f"put_ with accumulate=True at indices [0, 0, 2]: {put_acc.tolist()}")
    print(f"torch.empty under it: {torch.empty(3).tolist()} "
          f"(fill_uninitialized_memory {torch.utils.deterministic.fill_uninitialized_memory})")
    empty_int = torch.empty(2, dtype=torch.int32).tolist()
    print(f"torch.empty(2, dtype=torch.int32): {empty_int}, int32's largest value: "
          f"{empty_int == [torch.iinfo(torch.int32).max] * 2}")
finally:
    torch.use_deterministic_algorithms(False)  # global state: do not leak into later code
print(f"deterministic mode now {torch.are_deterministic_algorithms_enabled()}")
print(f"cuDNN switches: deterministic {torch.backends.cudnn.deterministic}, "
      f"benchmark {torch.backends.cudnn.benchmark}")

# %% [markdown]
# Output:
# ```text
# same seed: same init True, same loader order True
# deterministic mode True: index_put_ [2.0, 0.0, 1.0]
# put_ at indices [0, 2]: put_ does not have a deterministic implementation
# put_ with accumulate=True at indices [0, 0, 2]: [2.0, 0.0, 1.0]
# torch.empty under it: [nan, nan, nan] (fill_uninitialized_memory True)
# torch.empty(2, dtype=torch.int32): [2147483647, 2147483647], int32's largest value: True
# deterministic mode now False
# cuDNN switches: deterministic False, benchmark False
# ```
#
# Seeding makes the *random numbers* repeat: same initial weights, same dropout masks, same
# loader order. The deterministic switch is about *kernels*: the accumulating `index_put_`
# takes its deterministic path on the CPU. `put_` without `accumulate` (its default) has no
# deterministic implementation (with a repeated index, which write wins is unspecified),
# and it does not look at its indices to find out: under the switch it raises, on the CPU
# too, even when no index repeats. `put_(..., accumulate=True)` adds instead of writing,
# and runs, deterministically on the CPU. Most ops that raise under the switch are GPU
# kernels whose parallel threads add into the same place in a varying order. A visible CPU
# effect: `torch.empty` fills new memory with NaN (integers with their largest value;
# `fill_uninitialized_memory` is True by default), so code that reads memory it never
# wrote shows NaN instead of old garbage. The switch is global state, so the cell turns it
# back off.
#
# On a GPU two more switches matter. cuDNN picks a convolution algorithm per shape:
# `torch.backends.cudnn.benchmark = True` times several and keeps the fastest, which can
# differ from run to run, and `torch.backends.cudnn.deterministic = True` restricts it to
# deterministic ones (both are off by default, as printed). And cuBLAS, under the
# deterministic switch, refuses to run a matrix product unless the environment variable
# `CUBLAS_WORKSPACE_CONFIG` is `:4096:8` or `:16:8` before the process first uses it: a
# fixed workspace makes its reductions repeat (both unverified on a GPU). Full
# reproducibility also needs the same library versions and hardware.

# %% [markdown]
# ## Summary
#
# - A DataLoader = sampler (order) → batch sampler (`batch_size`, `drop_last`) →
#   `collate_fn`. `shuffle=True` is a `RandomSampler`: one permutation per epoch from the
#   loader's `generator`. The last short batch stays unless `drop_last=True`.
# - The default `collate_fn` stacks, so variable-length items need one of your own: pad
#   each batch to its own longest sequence, with a mask True on real tokens computed from
#   the lengths. Sorting by length cuts the padding further.
# - Workers get a copy of the dataset (forked, or pickled under spawn and forkserver: keep
#   the dataset, `collate_fn` and `worker_init_fn` in an importable module, and a script's
#   work under `if __name__ == "__main__":`, since spawn and forkserver run the main script
#   again in every worker). The loader seeds torch, `random` and NumPy's global RNG per
#   worker from `base_seed`, which comes from its `generator`. Reseed anything else (a
#   dataset's own generator) in `worker_init_fn`; a seeded `torch.Generator` then makes two
#   runs give the same batches.
# - Each worker runs an `IterableDataset`'s whole `__iter__`: shard it with
#   `get_worker_info()`, or every item comes once per worker.
# - `num_workers × prefetch_factor` batches are in flight. Each worker runs torch on one
#   thread; the workers and the main process's threads share the CPUs this process may use,
#   and the loader warns when `num_workers` alone exceeds them. `pin_memory=True` puts
#   batches in page-locked memory for asynchronous copies to a CUDA GPU (and does nothing
#   without one). A `DataLoader` has no `state_dict`: resuming mid-epoch takes torchdata's
#   `StatefulDataLoader`.
# - `torch.manual_seed` repeats random numbers; `use_deterministic_algorithms(True)` picks
#   deterministic kernels or raises (mostly on GPUs, but `put_` without `accumulate`
#   raises on the CPU too, even when no index repeats) and fills `torch.empty` with NaN
#   (integers with their largest value). On a GPU, also mind cuDNN's `benchmark` and
#   `deterministic` switches and `CUBLAS_WORKSPACE_CONFIG`.

# %% [markdown]
# ## References
#
# - [`torch.utils.data`](https://docs.pytorch.org/docs/2.13/data.html): datasets (map-style and iterable), samplers,
#   `collate_fn`, worker processes and their seeding, memory pinning: this lesson's whole subject.
# - [`torch.nn.utils.rnn.pad_sequence`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.utils.rnn.pad_sequence.html):
#   the padding inside section 2's `collate_fn`.
# - [`torch.Generator`](https://docs.pytorch.org/docs/2.13/generated/torch.Generator.html) and
#   [`torch.manual_seed`](https://docs.pytorch.org/docs/2.13/generated/torch.manual_seed.html): the random streams
#   behind an epoch's order and the workers' seeds.
# - [`torch.multiprocessing`](https://docs.pytorch.org/docs/2.13/multiprocessing.html): start methods and sharing
#   tensors between processes, under section 3's workers.
# - [`torch.set_num_threads`](https://docs.pytorch.org/docs/2.13/generated/torch.set_num_threads.html) and
#   [`torch.get_num_threads`](https://docs.pytorch.org/docs/2.13/generated/torch.get_num_threads.html): the intra-op
#   threads that section 5's workers set to one.
# - [`torch.Tensor.pin_memory`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.pin_memory.html): page-locked
#   memory, what `pin_memory=True` gives each batch.
# - [`torch.use_deterministic_algorithms`](https://docs.pytorch.org/docs/2.13/generated/torch.use_deterministic_algorithms.html):
#   the switch of section 6, with the list of ops that raise under it.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this lesson showed is implemented. Open each file
# in your editor at the line printed (the line numbers are those of your installed torch;
# they move between releases). The stops follow a batch's way: the sampler, the default
# collate that section 2 replaces, the loader's prefetching, the worker that seeds itself,
# then the deterministic switch.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/utils/data/sampler.py", "class RandomSampler(",
     "`__iter__` yields one `torch.randperm(n)` per epoch from `self.generator`; without one it "
     "first draws a seed from the global RNG, which is why `torch.manual_seed` alone repeated "
     "a shuffled loader's order in section 6."),
    ("torch/utils/data/_utils/collate.py", "return torch.stack(batch, 0, out=out)",
     "The end of `collate_tensor_fn`, what the default `collate_fn` does with a list of tensors: "
     "`torch.stack`, which needs equal sizes (section 2's error); inside a worker, the lines "
     "above make it stack straight into shared memory, so the batch reaches the main process "
     "without another copy."),
    ("torch/utils/data/dataloader.py", "class _MultiProcessingDataLoaderIter(",
     "`_reset` primes the workers with `prefetch_factor * num_workers` calls of "
     "`_try_put_index`, and `_process_data` puts one more for every batch received (section "
     "5's 4, then 5); the `_base_seed` the workers' seeds start from is drawn from the "
     "loader's `generator` in `_BaseDataLoaderIter.__init__`, above it, and above that "
     "`check_worker_number_rationality` compares `num_workers` with the usable CPUs."),
    ("torch/utils/data/_utils/worker.py", "def _worker_loop(",
     "Before its first item a worker sets `torch.set_num_threads(1)`, seeds `random` and torch "
     "with `base_seed + worker_id`, NumPy's global RNG with `_generate_state(base_seed, "
     "worker_id)`, records the seed in `WorkerInfo` and calls your `worker_init_fn`; nothing "
     "here reseeds a generator your dataset made itself, hence section 3's repeated draws."),
    ("torch/__init__.py", "def use_deterministic_algorithms(",
     "The docstring lists the ops that take a deterministic path under the switch and those "
     "that raise (`put_` without `accumulate` among them, on the CPU too), and what "
     "`fill_uninitialized_memory` does to `torch.empty`."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/utils/data/sampler.py:«line»  `class RandomSampler(`
#     `__iter__` yields one `torch.randperm(n)` per epoch from `self.generator`; without
#     one it first draws a seed from the global RNG, which is why `torch.manual_seed`
#     alone repeated a shuffled loader's order in section 6.
# torch/utils/data/_utils/collate.py:«line»  `return torch.stack(batch, 0, out=out)`
#     The end of `collate_tensor_fn`, what the default `collate_fn` does with a list of
#     tensors: `torch.stack`, which needs equal sizes (section 2's error); inside a
#     worker, the lines above make it stack straight into shared memory, so the batch
#     reaches the main process without another copy.
# torch/utils/data/dataloader.py:«line»  `class _MultiProcessingDataLoaderIter(`
#     `_reset` primes the workers with `prefetch_factor * num_workers` calls of
#     `_try_put_index`, and `_process_data` puts one more for every batch received
#     (section 5's 4, then 5); the `_base_seed` the workers' seeds start from is drawn
#     from the loader's `generator` in `_BaseDataLoaderIter.__init__`, above it, and above
#     that `check_worker_number_rationality` compares `num_workers` with the usable CPUs.
# torch/utils/data/_utils/worker.py:«line»  `def _worker_loop(`
#     Before its first item a worker sets `torch.set_num_threads(1)`, seeds `random` and
#     torch with `base_seed + worker_id`, NumPy's global RNG with
#     `_generate_state(base_seed, worker_id)`, records the seed in `WorkerInfo` and calls
#     your `worker_init_fn`; nothing here reseeds a generator your dataset made itself,
#     hence section 3's repeated draws.
# torch/__init__.py:«line»  `def use_deterministic_algorithms(`
#     The docstring lists the ops that take a deterministic path under the switch and
#     those that raise (`put_` without `accumulate` among them, on the CPU too), and what
#     `fill_uninitialized_memory` does to `torch.empty`.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each question before you open its answer; every answer points to the section whose
# printed lines show it.
#
# 1. **Spot the bug.** A dataset creates `self.rng = np.random.default_rng(0)` in `__init__`
#    and draws a random augmentation from it in `__getitem__`. The loader has 2 workers, a
#    seeded `generator` and no `worker_init_fn`. Which draws repeat, and what fixes it?
#
#    <details><summary>Answer</summary>
#
#    Each worker receives a copy of the same generator state, so worker 1's batches draw what
#    worker 0's drew (`own rng [85, 63, 51]` in the first batch of each); each new set of
#    workers starts again from a fresh copy, so every generator seed, and every epoch unless
#    `persistent_workers=True` keeps the workers (and their copies) alive, repeats them too.
#    Python's `random` and NumPy's global RNG do differ per worker: the loader seeds those.
#    The fix is a `worker_init_fn` that reseeds the dataset's generator from
#    `get_worker_info().seed` (`base_seed + worker_id`): the workers' draws then differ, two
#    runs with generator seed 0 give the same batches, and seed 1 other ones.
#    (*§ Worker processes and their random state*)
#
#    </details>
#
# 2. **Predict.** A stream of 32 lines (an `IterableDataset` whose `__iter__` ignores
#    `get_worker_info()`) is read by a loader with `num_workers=2` and `batch_size=4`. How
#    many batches does an epoch have, and how often does each line appear? Can you pass
#    `shuffle=True` to fix the order?
#
#    <details><summary>Answer</summary>
#
#    16 batches, 64 items: each worker ran the whole `__iter__`, so every line appears twice
#    (`each line seen [2] time(s)`), without a warning. Sharding on `get_worker_info()`
#    gives 8 batches and each line once. `shuffle=True` raises a `ValueError` for an
#    `IterableDataset`: there is no index to shuffle, so shuffling is the stream's own job.
#    (*§ Iterable datasets: every worker runs the whole stream*)
#
#    </details>
#
# 3. **Explain.** A loader with `num_workers=2` and the default `prefetch_factor` has just
#    returned its first batch. How many batches of indices has it taken from its sampler,
#    and what does `torch.get_num_threads()` return inside a worker when the training
#    process itself uses 3 threads?
#
#    <details><summary>Answer</summary>
#
#    5: at `iter()` it handed each worker `prefetch_factor` = 2 batches (4 in flight), and
#    one more for the batch it received (`batches taken at iter() 4, after the first batch
#    5`). With `prefetch_factor=4`, 8 then 9. Inside each worker torch runs on 1 thread
#    (`inside each of its 2 workers: {0: 1, 1: 1}`): the worker sets it before its first
#    item, whatever the main process uses.
#    (*§ Batches in flight: `num_workers`, `prefetch_factor`, `pin_memory`*)
#
#    </details>
#
# 4. **Predict.** With `torch.use_deterministic_algorithms(True)`, on the CPU, does
#    `torch.zeros(3).put_(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))` run, although
#    no index repeats? What does `torch.empty(3)` hold under the switch?
#
#    <details><summary>Answer</summary>
#
#    It raises: `put_ does not have a deterministic implementation`, on the CPU too, without
#    looking at whether an index repeats. `torch.empty(3)` holds `[nan, nan, nan]`: under the
#    switch new memory is filled with NaN (`fill_uninitialized_memory True`). The
#    accumulating `index_put_` does run, taking its deterministic path (`[2.0, 0.0, 1.0]`).
#    (*§ Reproducibility switches*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `batch_indices(n, batch_size, shuffle, drop_last, seed=0)`: one epoch of batches of
#    indices, as a `BatchSampler` over a `SequentialSampler`, or over a `RandomSampler`
#    with `generator=torch.Generator().manual_seed(seed)`, produces them, without touching
#    the global random state.
# 2. `pad_collate(seqs, pad_id=0)`: pad a batch of token sequences to its longest one and
#    return `(tokens, mask)`, empty sequences included.
#
# Check your answers with `make exercises N=04b`: your batches are compared with PyTorch's
# samplers (and torch's global RNG must be left alone), your padding with hand-made
# batches. `solutions.py` has one way to write them.

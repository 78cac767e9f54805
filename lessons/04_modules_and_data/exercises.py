"""Lesson 04 exercises: a module registry, batch indices, and a pad-and-mask collate.

Replace each `raise NotImplementedError` with your code, then run `make exercises N=04`:
the tests compare your registry with `torch.nn.Module` on the same structures, your batches
with PyTorch's samplers, and your padding with hand-made batches.
"""

from __future__ import annotations

import torch
from torch import nn


class Module:
    """A plain-Python registry of parameters and submodules, like `nn.Module`'s.

    A *parameter* is any `torch.nn.Parameter`; a *submodule* is any instance of this
    `Module` class (so `ModuleList` too). Registration order is the order of first
    assignment; re-assigning a name keeps its place.
    """

    def __init__(self):
        """Create the two empty registries: `self._parameters` and `self._modules` (dicts).

        Hint: your `__setattr__` needs these dicts, so create them with
        `object.__setattr__(self, "_parameters", {})` (and the same for `_modules`).
        """
        raise NotImplementedError("Module.__init__")

    def __setattr__(self, name: str, value) -> None:
        """File `value` under `name`.

        - an `nn.Parameter` goes to `self._parameters[name]`;
        - a `Module` goes to `self._modules[name]`;
        - anything else becomes an ordinary attribute (`object.__setattr__`).

        A name lives in one place only: registering it removes it from the other registry
        and from the ordinary attributes (as `nn.Module` does), and an ordinary value
        assigned to a registered name removes that registration.
        """
        raise NotImplementedError("Module.__setattr__")

    def __getattr__(self, name: str):
        """Called only when normal lookup fails: return `self._parameters[name]` or
        `self._modules[name]`; raise `AttributeError` when the name is in neither."""
        raise NotImplementedError("Module.__getattr__")

    def named_parameters(self, prefix: str = "") -> list[tuple[str, nn.Parameter]]:
        """Every parameter object once, with its dotted name, as `nn.Module` orders them.

        This module's own parameters first (registration order), then each submodule's, in
        registration order, recursively; a submodule registered as `blocks` contributes
        `blocks.<name>`. A parameter object reachable under several names (tied weights, or
        a submodule registered twice) appears once, under the first name met.
        `prefix` is prepended to every name (`prefix + "." + name` when not empty).
        """
        raise NotImplementedError("Module.named_parameters")

    def parameters(self) -> list[nn.Parameter]:
        """The parameter objects of `named_parameters()`, in the same order."""
        raise NotImplementedError("Module.parameters")

    def state_dict(self, prefix: str = "") -> dict[str, nn.Parameter]:
        """{dotted name: parameter} for *every* name, duplicates included, in the same
        order as `named_parameters` would list them if nothing were shared (own parameters,
        then submodules recursively). Values are the parameter objects themselves."""
        raise NotImplementedError("Module.state_dict")


class ModuleList(Module):
    """A `Module` holding submodules under the names "0", "1", ... (like `nn.ModuleList`)."""

    def __init__(self, modules=()):
        """Register each module of the iterable `modules`, in order, as `append` does."""
        raise NotImplementedError("ModuleList.__init__")

    def append(self, module: Module) -> None:
        """Register `module` under the next index: `str(len(self))`."""
        raise NotImplementedError("ModuleList.append")

    def __len__(self) -> int:
        raise NotImplementedError("ModuleList.__len__")

    def __iter__(self):
        """Iterate over the registered modules in index order."""
        raise NotImplementedError("ModuleList.__iter__")

    def __getitem__(self, i: int) -> Module:
        """The module at index `i`; negative `i` counts from the end, as for a list."""
        raise NotImplementedError("ModuleList.__getitem__")


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

"""Lesson 04a exercises: a module registry in plain Python.

Replace each `raise NotImplementedError` with your code, then run `make exercises N=04a`:
your registry is compared with `torch.nn.Module` on the same structures.
"""

from __future__ import annotations

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

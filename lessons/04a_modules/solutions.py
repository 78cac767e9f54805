"""Lesson 04a solutions: one way to write the exercise in `exercises.py` (same contract)."""

from __future__ import annotations

from torch import nn


class Module:
    """A plain-Python registry of parameters and submodules (see exercises.py)."""

    def __init__(self):
        # object.__setattr__: our own __setattr__ would look for these dicts first
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name, value):
        params, mods = self.__dict__["_parameters"], self.__dict__["_modules"]
        if isinstance(value, nn.Parameter):
            mods.pop(name, None)
            self.__dict__.pop(name, None)
            params[name] = value  # an existing key keeps its place
        elif isinstance(value, Module):
            params.pop(name, None)
            self.__dict__.pop(name, None)
            mods[name] = value
        else:
            params.pop(name, None)
            mods.pop(name, None)
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for registry in ("_parameters", "_modules"):
            found = self.__dict__.get(registry, {})  # .get: safe before __init__ ran
            if name in found:
                return found[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def _walk(self, prefix, seen):
        """(name, parameter) pairs: own first, then submodules; skip ids in `seen`."""
        dot = prefix + "." if prefix else ""
        for name, p in self._parameters.items():
            if seen is None or id(p) not in seen:
                if seen is not None:
                    seen.add(id(p))
                yield dot + name, p
        for name, m in self._modules.items():
            yield from m._walk(dot + name, seen)

    def named_parameters(self, prefix=""):
        return list(self._walk(prefix, seen=set()))

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def state_dict(self, prefix=""):
        return dict(self._walk(prefix, seen=None))  # no dedup: every name is a key


class ModuleList(Module):
    """Submodules under "0", "1", ... (see exercises.py)."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self)), module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def __getitem__(self, i):
        return list(self._modules.values())[i]  # a list index: negatives, IndexError

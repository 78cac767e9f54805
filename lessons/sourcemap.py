"""The course's source map: where, in PyTorch's own files, a lesson's behaviour is implemented.

Every lesson ends with a *Read the source* cell that calls ``read_the_source(stops)``. A stop
is a tuple ``(path, text, what_to_look_for)``:

- ``path`` relative to the folder that holds the installed ``torch`` package (site-packages):
  ``"torch/_tensor.py"``, ``"torch/include/c10/core/TensorImpl.h"``,
  ``"torchgen/packaged/ATen/native/native_functions.yaml"``. The wheel ships every Python
  module, the C++ headers under ``torch/include/`` and the operator schemas. The line
  printed is the first one that contains ``text``, so it points into *your* installation
  (line numbers move between releases and builds; the file and the text do not, within one).
- or ``"pytorch:<path in PyTorch's repository>"`` for a file the wheel does not ship (a
  ``.cpp`` kernel): printed as a link at the release tag of the installed torch, with
  ``text`` as what to search for once it is open.

A stop whose file or text is missing raises ``LookupError``: after a PyTorch upgrade that
is how a moved function shows up (the course's tests check every stop of every lesson).
Standard library only, and it never imports torch: it reads files.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import textwrap
from pathlib import Path

REPO = "pytorch:"  # prefix of a path in PyTorch's repository (not shipped in the wheel)
GITHUB = "https://github.com/pytorch/pytorch/blob"
WIDTH = 88  # what to look for is wrapped to this width, indented under its stop


def site_root() -> Path:
    """The folder that holds the installed torch package (found without importing it)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise LookupError("torch is not installed in this Python")
    return Path(spec.origin).parent.parent


def release() -> str:
    """The installed torch's release, without the build's local part: 2.13.0+cpu -> 2.13.0."""
    return importlib.metadata.version("torch").split("+")[0]


def find_line(path: str, text: str) -> int:
    """The 1-based number of the first line of ``path`` (under site_root) containing ``text``."""
    file = site_root() / path
    if not file.is_file():
        raise LookupError(f"torch {release()} has no file {path}")
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if text in line:
            return number
    raise LookupError(f"{path} in torch {release()} no longer contains {text!r}")


def link(path: str) -> str:
    """A link to a file of PyTorch's repository at the installed release's tag."""
    return f"{GITHUB}/v{release()}/{path.removeprefix(REPO)}"


def indented(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="    ", subsequent_indent="    ",
                         break_long_words=False, break_on_hyphens=False)


def read_the_source(stops: list[tuple[str, str, str]]) -> None:
    """Print where each stop is: ``path:line`` in the installed torch, or a link, and under
    it, indented, what to look for there."""
    print(f"torch {release()} installed in {site_root()}")
    for path, text, look in stops:
        if path.startswith(REPO):
            print(f"{link(path)}\n{indented(f'search for `{text}`: {look}')}")
        else:
            print(f"{path}:{find_line(path, text)}  `{text}`\n{indented(look)}")

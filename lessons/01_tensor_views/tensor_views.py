# %% [markdown]
# # 01 · Tensor views: a tensor is metadata over storage
#
# A PyTorch tensor is two things: a flat block of memory (its *storage*) and a small
# record that says how to read it (sizes, strides, a storage offset, a dtype, a device).
# Transposing, slicing, and reshaping a contiguous tensor only write a new record: the
# numbers stay where they are. This lesson takes that record apart.
#
# **What you will learn**
#
# - what storage, sizes, strides, storage offset, dtype and device are, and how to print them;
# - why PyTorch counts strides in elements and NumPy in bytes;
# - that the record is a C++ object, a `TensorImpl`, which a Python tensor is a handle to;
# - why a transpose or a slice costs nothing, and why writing through it changes the base;
# - what `._base` records, and why program logic should not depend on it;
# - what "contiguous" means exactly, and when `view` works, when it fails, and what
#   `reshape` and `contiguous()` copy;
# - what a memory format is (`channels_last`: same shape, other strides), and which ops keep it;
# - what the (B, S, H, D) → (B, H, S, D) transpose of attention does to memory, which op
#   copies because of it without saying so (`q @ kᵀ`), and what the hidden copies cost.
#
# **Prerequisites:** Python, and tensor basics (`torch.arange`, indexing, `.shape`).
#
# **How to run:** `python lessons/01_tensor_views/tensor_views.py` or `make lesson N=01`
# from the repository root, or open `tensor_views.ipynb`. Everything runs on the CPU in a
# few seconds. Each printing cell is followed by an *Output* block: what it printed with the
# pinned PyTorch (2.13.0). Your run prints the same lines; a part marked `«time»` or
# `«ratio»` depends on your machine. Run outside the course's venv, this lesson may also
# print PyTorch's own diagnostic lines to stderr: `USDT: ... profiler_start` and
# `profiler_stop` around each profiler run and, on a CUDA build without a GPU,
# `gpuGetDeviceCount failed`. They are harmless, and the course's venv (`.venv`, made by
# any `make lesson`) turns them off.

# %%
import itertools
import math
import os
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.patches import Rectangle

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results, comparable timings
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))


def same_storage(a, b):
    """True when a and b read the same allocation (compares start addresses, never printed)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def storage_values(t):
    """The whole storage under t, in storage order, as a 1-D view (no copy)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return t.as_strided((n,), (1,), 0)  # offset 0 here is absolute: the storage's start


def positions(t):
    """The storage position each element of t reads, in row-major order (asks PyTorch)."""
    probe = torch.arange(len(storage_values(t)))  # cell p holds the value p
    return probe.as_strided(t.shape, t.stride(), t.storage_offset()).flatten().tolist()


def first_sentence(err):
    """The first sentence of an error message: stable, and short enough to print."""
    return str(err).split(". ")[0]


# %% [markdown]
# ## 1. The record: sizes, strides, offset, dtype, device
#
# **Predict.** `x = torch.arange(6).reshape(2, 3)` holds the int64 values 0..5. To go from
# `x[0, 0]` to `x[1, 0]` you skip a whole row; to go to `x[0, 1]`, one element. What will
# `x.stride()` be? How many bytes does its storage hold?

# %%
x = torch.arange(6).reshape(2, 3)  # (2, 3) int64
print(f"x {x.tolist()}")
print(f"shape {tuple(x.shape)}  strides {x.stride()}  offset {x.storage_offset()}")
print(f"dtype {x.dtype}  element size {x.element_size()} bytes  device {x.device}")
print(f"storage {x.untyped_storage().nbytes()} bytes, in storage order {storage_values(x).tolist()}")

# %% [markdown]
# Output:
# ```text
# x [[0, 1, 2], [3, 4, 5]]
# shape (2, 3)  strides (3, 1)  offset 0
# dtype torch.int64  element size 8 bytes  device cpu
# storage 48 bytes, in storage order [0, 1, 2, 3, 4, 5]
# ```
#
# The storage is a flat run of 6 × 8 = 48 bytes. The strides say how many *elements* to
# skip per step along each dimension: 3 to the next row, 1 to the next column. Element
# `x[i, j]` lives at storage position `offset + 3*i + 1*j`. In general, for an index
# `(i0, i1, ...)` the position is `offset + i0*stride0 + i1*stride1 + ...`: that formula is
# all a strided tensor is.
#
# **Predict.** NumPy stores the same kind of record. `x.numpy()` shares x's memory. What
# will its `.strides` be?

# %%
a = x.numpy()  # shares x's memory: no copy
print(f"torch strides {x.stride()} (elements)")
print(f"numpy strides {a.strides} (bytes), itemsize {a.itemsize}")
print(f"stride x itemsize {tuple(s * x.element_size() for s in x.stride())}")
print(f"the array reads x's memory: {a.ctypes.data == x.data_ptr()}")  # addresses compared, not printed
f = np.arange(6, dtype=np.float32).reshape(2, 3)  # a float32 array built by NumPy itself
print(f"float32 numpy strides {f.strides}, torch strides {torch.from_numpy(f).stride()}")

# %% [markdown]
# Output:
# ```text
# torch strides (3, 1) (elements)
# numpy strides (24, 8) (bytes), itemsize 8
# stride x itemsize (24, 8)
# the array reads x's memory: True
# float32 numpy strides (12, 4), torch strides (3, 1)
# ```
#
# Same layout, two units: NumPy strides are byte strides, PyTorch strides are element
# strides, and `numpy_stride = torch_stride * itemsize`. The float32 array makes the point:
# its byte strides halve, its element strides do not change. PyTorch counts elements
# because the dtype is already in the record; the storage offset is counted in elements too.

# %% [markdown]
# ## 2. A transpose is a new record over the same storage
#
# **Predict.** `y = x.t()` has shape (3, 2). Does PyTorch move the six numbers? What are
# `y`'s strides? Where does the value 3 sit in `y`?

# %%
y = x.t()  # (3, 2)
print(f"y {y.tolist()}")
print(f"shape {tuple(y.shape)}  strides {y.stride()}  contiguous {y.is_contiguous()}")
print(f"same storage: {same_storage(x, y)}")
print(f"storage {y.untyped_storage().nbytes()} bytes, in storage order {storage_values(y).tolist()}")
print(f"x[1, 0] = {x[1, 0].item()}  y[0, 1] = {y[0, 1].item()}")

# %% [markdown]
# Output:
# ```text
# y [[0, 3], [1, 4], [2, 5]]
# shape (3, 2)  strides (1, 3)  contiguous False
# same storage: True
# storage 48 bytes, in storage order [0, 1, 2, 3, 4, 5]
# x[1, 0] = 3  y[0, 1] = 3
# ```
#
# The transpose swapped the sizes *and* the strides, nothing else. Both tensors point to
# the same 48 bytes (we compare the storages' start addresses rather than print them: an
# address changes from run to run). The value 3 is storage position 3: `x` reaches it as
# `0 + 3*1 + 1*0` and `y` as `0 + 1*0 + 3*1`. `y` is *not contiguous*: a new tensor of
# shape (3, 2) would get strides (2, 1), and `y` has (1, 3). Section 3 states the rule.
#
# **The record is a C++ object.** Each tensor's record lives in C++, in a `TensorImpl`: the
# sizes, strides, offset, dtype and device, a reference to the storage, and a version
# counter (lesson 02). The Python tensor is a handle to it; `t._cdata` (private) is the
# address of its `TensorImpl`, which we compare and never print.
#
# **Predict.** Give a tensor `t` a Python attribute. Which of `t.add_(1)`, `t.t()`,
# `t.detach()` and `t.clone()` hand you back `t` itself? Which are a new `TensorImpl` over
# the same storage? And what does the in-place transpose `t.t_()` do to `t`'s record?
# (Partly a guess: the cell's output shows how PyTorch answers.)


# %%
def same_impl(a, b):
    """True when a and b are handles to the same C++ TensorImpl (private `_cdata`)."""
    return a._cdata == b._cdata


t = torch.zeros(2, 3)  # (2, 3)
t.note = "set in Python"  # lives on the Python object, not in the TensorImpl
results = {"t.add_(1)": t.add_(1), "t.t()": t.t(), "t.detach()": t.detach(), "t.clone()": t.clone()}
print(f"{'call':<11} {'same object':<12} {'same TensorImpl':<16} same storage")
for name, u in results.items():
    print(f"{name:<11} {u is t!s:<12} {same_impl(u, t)!s:<16} {same_storage(u, t)}")
print(f"t.add_(1).note: {results['t.add_(1)'].note!r}")
before = (tuple(t.shape), t.stride(), t.untyped_storage().data_ptr())
t.t_()  # (3, 2): an in-place transpose
print(f"t.t_(): shape {before[0]} -> {tuple(t.shape)}, strides {before[1]} -> {t.stride()}, "
      f"same TensorImpl: {same_impl(t, results['t.add_(1)'])}, "
      f"same storage: {t.untyped_storage().data_ptr() == before[2]}")
d, version = results["t.detach()"], t._version
d.add_(1)  # a write through the detached tensor
print(f"t._version {version} -> {t._version} after d.add_(1) on d = t.detach()")

# %% [markdown]
# Output:
# ```text
# call        same object  same TensorImpl  same storage
# t.add_(1)   True         True             True
# t.t()       False        False            True
# t.detach()  False        False            True
# t.clone()   False        False            False
# t.add_(1).note: 'set in Python'
# t.t_(): shape (2, 3) -> (3, 2), strides (3, 1) -> (1, 3), same TensorImpl: True, same storage: True
# t._version 2 -> 3 after d.add_(1) on d = t.detach()
# ```
#
# An in-place op returns its input's own `TensorImpl`, and PyTorch keeps one Python object
# per `TensorImpl`, so `t.add_(1)` is `t`, attribute included. `t.t()` and `t.detach()`
# are new records over the same storage (one more handle each, no numbers copied), and
# `t.clone()` is a new record over new storage. `t.t_()` rewrites `t`'s own record: same
# `TensorImpl`, new sizes and strides, same storage. The version counter is shared too: a
# write through `d` counts as a write to `t` (which already stood at 2: `add_` and `t_()`
# each counted as one), and that is how autograd notices writes through a `detach()`ed
# alias (lesson 03a).

# %% [markdown]
# ## 3. A slice is a view with an offset
#
# **Predict.** `m = torch.arange(12).reshape(3, 4)`. Row `m[1]` and column `m[:, 1]` are
# views too. At which storage position does each start, and what is its stride? What about
# every other column, `m[:, ::2]`?

# %%
m = torch.arange(12).reshape(3, 4)  # (3, 4)
row, col, even = m[1], m[:, 1], m[:, ::2]  # (4,), (3,), (3, 2)
for name, t in [("m[1]", row), ("m[:, 1]", col), ("m[:, ::2]", even)]:
    print(f"{name:<10} {str(t.tolist()):<26} offset {t.storage_offset()}  strides {t.stride()}")
print(f"same storage: {same_storage(m, row) and same_storage(m, col) and same_storage(m, even)}")

# %% [markdown]
# Output:
# ```text
# m[1]       [4, 5, 6, 7]               offset 4  strides (1,)
# m[:, 1]    [1, 5, 9]                  offset 1  strides (4,)
# m[:, ::2]  [[0, 2], [4, 6], [8, 10]]  offset 0  strides (4, 2)
# same storage: True
# ```
#
# Row 1 starts 4 cells in (one row of 4 skipped) and walks with stride 1. Column 1 starts
# at cell 1 and jumps a whole row (4 cells) per step. Taking every other column doubles
# the column stride to 2. A slice is a new offset and new strides over the same storage:
# no numbers are copied, whatever the step.
#
# **Predict.** Read in row-major order, `m[:, ::2]` visits storage cells 0, 2, 4, 6, 8, 10:
# always forward. Is it contiguous? And the last row, `m[2:]`, which starts 8 cells in? And
# `m[1:2].t()`, the (4, 1) transpose of a one-row slice?


# %%
def contiguous_by_rule(t):
    """Every dimension of size > 1 has the stride a new tensor of t's shape would get."""
    fresh = torch.empty(t.shape).stride()  # the contiguous strides of t's shape
    return t.numel() == 0 or all(s == c for n, s, c in zip(t.shape, t.stride(), fresh) if n != 1)


print(f"{'tensor':<11} {'positions read':<20} {'strides':<8} {'new tensor':<11} is_contiguous  rule")
for name, t in [("m[:, ::2]", m[:, ::2]), ("m[2:]", m[2:]), ("m[1:2].t()", m[1:2].t()), ("y = x.t()", y)]:
    print(f"{name:<11} {str(positions(t)):<20} {str(t.stride()):<8} "
          f"{str(torch.empty(t.shape).stride()):<11} {t.is_contiguous()!s:<14} {contiguous_by_rule(t)}")

# %% [markdown]
# Output:
# ```text
# tensor      positions read       strides  new tensor  is_contiguous  rule
# m[:, ::2]   [0, 2, 4, 6, 8, 10]  (4, 2)   (2, 1)      False          False
# m[2:]       [8, 9, 10, 11]       (4, 1)   (4, 1)      True           True
# m[1:2].t()  [4, 5, 6, 7]         (1, 4)   (1, 1)      True           True
# y = x.t()   [0, 3, 1, 4, 2, 5]   (1, 3)   (2, 1)      False          False
# ```
#
# Contiguous does not mean "reads storage in increasing order": `m[:, ::2]` does, and is not
# contiguous, because it skips cells. The rule PyTorch applies is about strides: a tensor
# is contiguous when each dimension of size greater than 1 has the stride that a new tensor
# of the same shape would get (column `new tensor`, the strides `torch.empty(shape)` gets).
# Equivalently, reading it in row-major order visits consecutive storage cells, one after
# the other. The offset does not matter (`m[2:]` starts at cell 8 and is contiguous), and
# neither does the stride of a size-1 dimension, which is never used to move: `m[1:2].t()`
# has strides (1, 4), but its second dimension has one element. `contiguous_by_rule` is that
# rule in two lines, and it agrees with `is_contiguous()` on the four views above (try it on
# views of your own: it agrees on every one).
#
# **Predict.** A stride can even be 0. `torch.arange(3).expand(2, 3)` shows two rows; how
# many bytes does it hold, and what is the stride that moves from row 0 to row 1? Can you
# write into it in place with `add_(1)`? With `fill_(7)`?

# %%
e = torch.arange(3).expand(2, 3)  # (2, 3) over 3 stored elements
print(f"expand {e.tolist()}  strides {e.stride()}  storage {e.untyped_storage().nbytes()} bytes")
try:
    e.add_(1)  # would add 1 to each stored cell twice
except RuntimeError as err:
    print(f"add_ failed: {first_sentence(err)}")
filled = torch.arange(3).expand(2, 3).fill_(7)  # (2, 3) over 3 stored elements
print(f"fill_(7) works: {filled.tolist()}  storage {storage_values(filled).tolist()}")

# %% [markdown]
# Output:
# ```text
# expand [[0, 1, 2], [0, 1, 2]]  strides (0, 1)  storage 24 bytes
# add_ failed: unsupported operation: more than one element of the written-to tensor refers to a single memory location
# fill_(7) works: [[7, 7, 7], [7, 7, 7]]  storage [7, 7, 7]
# ```
#
# Stride 0 means "do not move": every row reads the same three cells. That is how
# broadcasting repeats a tensor without storing the copies. Several indices share one cell,
# so most in-place ops refuse to write into it (`add_` here; `mul_` and `copy_` refuse
# too): the result would depend on the order of the writes. The full message
# suggests `clone()` first. `fill_` (and `zero_`) are allowed: they write the same value
# whichever index reaches a cell. As the exercises show, stride 0 also decides which
# `view`s are possible.

# %% [markdown]
# ## 4. Writing through a view writes the base
#
# **Predict.** Multiply the column view `col = m[:, 1]` by 10 in place. What happens to `m`?

# %%
col.mul_(10)  # in place, through the view
print(f"col {col.tolist()}")
print(f"m   {m.tolist()}")

# %% [markdown]
# Output:
# ```text
# col [10, 50, 90]
# m   [[0, 10, 2, 3], [4, 50, 6, 7], [8, 90, 10, 11]]
# ```
#
# There is only one copy of the numbers, so a write through any view is a write to the
# base, and to every other view of the same cells. That is what makes views cheap, and
# also why an in-place op on a view can surprise you (autograd tracks it with a version
# counter: lesson 03a).
#
# **Predict.** A view remembers the tensor it was made from in `._base`. For
# `base = torch.zeros(3, 4)`, `v1 = base[1:]` and `v2 = v1[:, 1:]`: is `v2._base` `v1` or
# `base`? What is the `_base` of `base.detach()`, of `base.reshape(-1)`, of
# `base.t().reshape(-1)`, and of `torch.arange(12).reshape(3, 4)`? (A guess for most of
# them: the table settles it.)


# %%
def base_name(t, known):
    """Which of the `known` tensors t._base is, by identity."""
    if t._base is None:
        return "None"
    return next((k for k, u in known.items() if t._base is u), f"a tensor of shape {tuple(t._base.shape)}")


base = torch.zeros(3, 4)  # (3, 4), made fresh: not a view
v1 = base[1:]  # (2, 4)
v2 = v1[:, 1:]  # (2, 3)
known = {"base": base, "v1": v1}
cases = {"base": base, "v1 = base[1:]": v1, "v2 = v1[:, 1:]": v2, "base.detach()": base.detach(),
         "base.reshape(-1)": base.reshape(-1), "base.t().reshape(-1)": base.t().reshape(-1),
         "torch.from_numpy(base.numpy())": torch.from_numpy(base.numpy()),
         "torch.arange(12).reshape(3, 4)": torch.arange(12).reshape(3, 4)}
print(f"{'tensor':<31} {'_base':<24} shares base's storage")
for name, u in cases.items():
    print(f"{name:<31} {base_name(u, known):<24} {same_storage(u, base)}")
small = torch.zeros(10**6)[:2]  # (2,) a view of a 4 MB tensor that has no other name
print(f"small = torch.zeros(10**6)[:2]: _base holds {small._base.numel():,} elements, "
      f"storage {small.untyped_storage().nbytes():,} bytes; small.clone(): "
      f"{small.clone().untyped_storage().nbytes()} bytes")
grown = torch.ones(3, requires_grad=True) * 1  # (3,) a result that autograd tracks
grown[0].mul_(2)  # in place, through a view
print(f"after grown[0].mul_(2): grown.grad_fn is {type(grown.grad_fn).__name__}")

# %% [markdown]
# Output:
# ```text
# tensor                          _base                    shares base's storage
# base                            None                     True
# v1 = base[1:]                   base                     True
# v2 = v1[:, 1:]                  base                     True
# base.detach()                   None                     True
# base.reshape(-1)                base                     True
# base.t().reshape(-1)            None                     False
# torch.from_numpy(base.numpy())  None                     True
# torch.arange(12).reshape(3, 4)  a tensor of shape (12,)  False
# small = torch.zeros(10**6)[:2]: _base holds 1,000,000 elements, storage 4,000,000 bytes; small.clone(): 8 bytes
# after grown[0].mul_(2): grown.grad_fn is CopySlices
# ```
#
# `_base` is the bookkeeping of autograd's view tracking, not a map of your code. It points
# to the root of a chain of views, not to the tensor you sliced (`v2._base` is `base`). It
# is `None` for `detach()` and for a NumPy round trip, which share the storage all the same
# (and, lesson 02, for views of inference tensors). Whether `reshape` sets it
# depends on the layout (section 5). And `torch.arange(12).reshape(3, 4)` is itself a view,
# of a temporary that no name refers to. A view also keeps its whole base alive: two
# elements that hold on to 4 MB until a `clone()` lets go. What autograd does with it: an
# in-place write through a view of `grown` rewrote the history of the base itself (its
# `grad_fn` is now `CopySlices`). So never branch on `_base` in program logic: code that
# works with views should be correct whether or not its inputs alias, and `clone()` where
# it must not.

# %% [markdown]
# ## 5. `view` needs compatible strides; `reshape` and `contiguous()` may copy
#
# `view(shape)` only writes a new record, so it must find strides that reach exactly the
# same cells in the new shape's row-major order.
#
# **Predict.** Will `y.view(-1)` (flatten the transpose) work? And `y.reshape(-1)`? If
# `reshape` works, does the result share `x`'s storage?


# %%
try:
    y.view(-1)
except RuntimeError as err:
    print(f"view(-1) failed: {first_sentence(err)}")
r = y.reshape(-1)  # (6,)
print(f"reshape(-1) {r.tolist()}  same storage: {same_storage(r, x)}")
r[0] = 100  # the copy is independent
print(f"after r[0] = 100: r[0] = {r[0].item()}, x[0, 0] = {x[0, 0].item()}")
print(f"x.reshape(-1) same storage: {same_storage(x.reshape(-1), x)}")

# %% [markdown]
# Output:
# ```text
# view(-1) failed: view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces)
# reshape(-1) [0, 3, 1, 4, 2, 5]  same storage: False
# after r[0] = 100: r[0] = 100, x[0, 0] = 0
# x.reshape(-1) same storage: True
# ```
#
# Flattening `y` row by row must read storage positions 0, 3, 1, 4, 2, 5. One stride
# cannot produce that sequence, so `view` refuses. The error's words: the dimensions of
# `y` do not form one *contiguous subspace* (a run of dimensions where each stride equals
# the next stride times the next size), and flattening would have to span two of them.
# `reshape` falls back to a copy: new storage, values laid out in the new order, no
# aliasing. On `x`, which is contiguous, `reshape(-1)` is just a view. So `reshape` may or
# may not alias its input; if you write to the result, know which.
#
# **Predict.** `contiguous()` returns a contiguous tensor (section 3's rule) with the same
# values. What does it do for `y`, and for `x`, which already is contiguous?

# %%
yc = y.contiguous()  # (3, 2), a copy laid out row by row
print(f"y.contiguous() strides {yc.stride()}  same storage: {same_storage(yc, x)}")
print(f"x.contiguous() is x: {x.contiguous() is x}  same storage: {same_storage(x.contiguous(), x)}")

# %% [markdown]
# Output:
# ```text
# y.contiguous() strides (2, 1)  same storage: False
# x.contiguous() is x: True  same storage: True
# ```
#
# For `y` it copies into a fresh storage with strides (2, 1). For `x` it returns `x`
# itself: no copy, same object. Calling `.contiguous()` "just in case" is therefore free
# when the tensor already is contiguous, and a full copy when it is not.

# %% [markdown]
# ## 6. Memory formats: same shape, other strides
#
# Images in a convolutional net are (N, C, H, W): batch, channels, height, width. Stored
# row-major, each channel is a block of H·W numbers. The *channels-last* memory format keeps
# the same shape and stores the C numbers of each pixel side by side instead (N, H, W, C in
# memory). Only the strides say which.
#
# **Predict.** What are the strides of `img.to(memory_format=torch.channels_last)` for a
# (2, 3, 4, 5) `img`? Is it contiguous? Are its values, read by index, equal to `img`'s?

# %%
img = torch.randn(2, 3, 4, 5, device=DEVICE)  # (N, C, H, W)
cl = img.to(memory_format=torch.channels_last)  # (N, C, H, W), channels innermost in memory
print(f"img shape {tuple(img.shape)}  strides {img.stride()}")
print(f"cl  shape {tuple(cl.shape)}  strides {cl.stride()}  same storage: {same_storage(cl, img)}")
in_own_format = cl.is_contiguous(memory_format=torch.channels_last)
print(f"cl.is_contiguous() {cl.is_contiguous()}  "
      f"cl.is_contiguous(memory_format=torch.channels_last) {in_own_format}")
print(f"equal values: {torch.equal(cl, img)}")

# %% [markdown]
# Output:
# ```text
# img shape (2, 3, 4, 5)  strides (60, 20, 5, 1)
# cl  shape (2, 3, 4, 5)  strides (60, 1, 15, 3)  same storage: False
# cl.is_contiguous() False  cl.is_contiguous(memory_format=torch.channels_last) True
# equal values: True
# ```
#
# Same shape, same values, new storage (the conversion copies), other strides: C now has
# stride 1 and W steps over the C channels of a pixel. `is_contiguous()` asks about the
# default, row-major format only; `channels_last` is contiguous in its own format.
#
# **Predict.** An op on a channels-last tensor returns a tensor of the same shape. Which
# memory format does it have? Try elementwise ops, a mix with an NCHW tensor, `clone`,
# `contiguous()`, a convolution, pooling, a softmax over the channels and a layer norm.
# (A guess: each op decides for itself, which is the point of the table.)


# %%
def memory_format(t):
    """Which of the two 4-D formats t is contiguous in (a tensor can be both, or neither)."""
    rows = t.is_contiguous(memory_format=torch.contiguous_format)
    last = t.is_contiguous(memory_format=torch.channels_last)
    return {(True, False): "row-major", (False, True): "channels_last"}.get((rows, last), "both or neither")


conv = torch.nn.Conv2d(3, 6, kernel_size=3, padding=1).to(DEVICE)  # 3 -> 6 channels
format_ops = {
    "a.relu()": lambda a: a.relu(),
    "a * 2": lambda a: a * 2,
    "a + img": lambda a: a + img,  # img is row-major
    "img + a": lambda a: img + a,
    "a.clone()": lambda a: a.clone(),
    "a.contiguous()": lambda a: a.contiguous(),
    "conv(a)": lambda a: conv(a),
    "F.max_pool2d(a, 2)": lambda a: F.max_pool2d(a, 2),
    "a.softmax(dim=1)": lambda a: a.softmax(dim=1),
    "F.layer_norm(a, (5,))": lambda a: F.layer_norm(a, (5,)),
}
with torch.no_grad():
    formats = {name: fn(cl) for name, fn in format_ops.items()}  # name -> (N, C', H', W') result
for name, out in formats.items():
    print(f"{name:<22} strides {str(out.stride()):<17} {memory_format(out)}")

# %% [markdown]
# Output:
# ```text
# a.relu()               strides (60, 1, 15, 3)    channels_last
# a * 2                  strides (60, 1, 15, 3)    channels_last
# a + img                strides (60, 1, 15, 3)    channels_last
# img + a                strides (60, 20, 5, 1)    row-major
# a.clone()              strides (60, 1, 15, 3)    channels_last
# a.contiguous()         strides (60, 20, 5, 1)    row-major
# conv(a)                strides (120, 1, 30, 6)   channels_last
# F.max_pool2d(a, 2)     strides (12, 1, 6, 3)     channels_last
# a.softmax(dim=1)       strides (60, 20, 5, 1)    row-major
# F.layer_norm(a, (5,))  strides (60, 20, 5, 1)    row-major
# ```
#
# Elementwise ops, `clone`, the convolution and the pooling keep channels-last. When the
# operands disagree, the result here takes the first operand's format (`a + img` and
# `img + a` differ). `contiguous()` converts back to row-major (a copy), and so, on this
# pinned PyTorch, do this softmax over the channels and this layer norm. A model can
# therefore switch formats back and forth without a word, each switch a copy: when you
# choose a memory format for speed, check the formats of the intermediate results, as here.

# %% [markdown]
# ## 7. The attention layout
#
# A projection in a transformer gives queries laid out as (B, S, H·D): batch, sequence,
# heads × head size. Splitting the last dimension into (H, D) is a view. Attention works on
# one (S, D) matrix per batch and head, so the code puts the heads before the sequence,
# (B, H, S, D), by swapping S and H.
#
# **Predict.** With B=2, S=4, H=3, D=5, what are the strides of `q` (B, S, H, D) and of
# `qh = q.transpose(1, 2)` (B, H, S, D)? Is `qh` contiguous? Is it a copy?

# %%
B, S, H, D = 2, 4, 3, 5
proj = torch.randn(B, S, H * D, device=DEVICE)  # (B, S, H*D), e.g. the output of x @ W_q
q = proj.view(B, S, H, D)  # (B, S, H, D): splitting the last dim is always a view
qh = q.transpose(1, 2)  # (B, H, S, D)
for name, t in [("q", q), ("qh", qh)]:
    print(f"{name:<3} shape {tuple(t.shape)}  strides {t.stride()}  contiguous {t.is_contiguous()}")
print(f"same storage: {same_storage(qh, proj)}")

# %% [markdown]
# Output:
# ```text
# q   shape (2, 4, 3, 5)  strides (60, 15, 5, 1)  contiguous True
# qh  shape (2, 3, 4, 5)  strides (60, 5, 15, 1)  contiguous False
# same storage: True
# ```
#
# `qh` is a permuted view: its strides (60, 5, 15, 1) are `q`'s strides in a new order, not
# decreasing any more. An op that reads its input through the strides takes such a view
# as it is; an op that needs another layout has to copy first. Which one happens is not
# visible in your code, as the rest of this section shows.
#
# **Predict.** A batched matmul wants 3-D input: can `qh.view(B * H, S, D)` merge the batch
# and head dimensions without copying? And after `.contiguous()`?

# %%
try:
    qh.view(B * H, S, D)
except RuntimeError as err:
    print(f"view(B*H, S, D) failed: {first_sentence(err)}")
qc = qh.contiguous()  # (B, H, S, D), a copy in row-major order
print(f"contiguous: strides {qc.stride()}  same storage: {same_storage(qc, proj)}")
nbytes = qc.numel() * qc.element_size()  # every element read once and written once
print(f"copied {qc.numel()} elements x {qc.element_size()} bytes = {nbytes} bytes")
q3 = qc.view(B * H, S, D)  # (B*H, S, D)
print(f"view(B*H, S, D) shape {tuple(q3.shape)}  strides {q3.stride()}  "
      f"same storage: {same_storage(q3, qc)}")

# %% [markdown]
# Output:
# ```text
# view(B*H, S, D) failed: view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces)
# contiguous: strides (60, 20, 5, 1)  same storage: False
# copied 120 elements x 4 bytes = 480 bytes
# view(B*H, S, D) shape (6, 4, 5)  strides (20, 5, 1)  same storage: True
# ```
#
# Merging B and H would need one stride that steps over heads (5) and over batches (60)
# evenly; 60 ≠ 3 × 5, so `view` refuses. `contiguous()` pays a copy of every element
# (each byte read once and written once), after which the merge is a free view.
# `reshape(B * H, S, D)` would do the same copy silently.
#
# **Predict.** Attention's first product is the scores, `q @ kᵀ`: one (S, S) matrix per
# batch and head. Written as `qh @ kh.transpose(-2, -1)` on the permuted views, does it
# copy anything? The profiler records every ATen operator call that goes through the
# dispatcher (lesson 02 looks at that layer), nested ones included: below, it lists what
# `matmul` calls and every `copy_` it runs.


# %%
def calls_and_copies(fn, top):
    """The ops that the ATen op `top` calls directly when fn runs, and the destination shape
    of every `aten::copy_` run anywhere inside fn (the profiler sees nested calls)."""
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, record_shapes=True) as prof:
        fn()
    events = prof.events()
    top_event = next(e for e in events if e.name == top)
    calls = [e.name.removeprefix("aten::") for e in top_event.cpu_children]
    return calls, [tuple(e.input_shapes[0]) for e in events if e.name == "aten::copy_"]


kh = torch.randn(B, S, H * D, device=DEVICE).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D) view


def scores():
    return qh @ kh.transpose(-2, -1)  # (B, H, S, S)


calls, copied = calls_and_copies(scores, "aten::matmul")
copied_bytes = sum(math.prod(shape) * qh.element_size() for shape in copied)
print(f"qh @ kh.transpose(-2, -1)\n  aten::matmul calls: {', '.join(calls)}")
print(f"  copies: {len(copied)}, into {' and '.join(map(str, copied))}: {copied_bytes} bytes")

# %% [markdown]
# Output:
# ```text
# qh @ kh.transpose(-2, -1)
#   aten::matmul calls: expand, reshape, expand, reshape, bmm, _unsafe_view
#   copies: 2, into (2, 3, 4, 5) and (2, 3, 5, 4): 960 bytes
# ```
#
# `matmul` is a composite op: it is written in terms of other ATen ops (lesson 02). For 4-D
# operands it expands both to a common batch shape and reshapes them to 3-D, (B·H, S, D)
# and (B·H, D, S), for one batched matrix multiply, `bmm`. Those reshapes merge B and H,
# the merge that `view` refused above, so each falls back to a copy: both operands are
# copied on every call, and nothing in the code says so. Whether a layout costs a copy
# depends on the op that consumes it: an op whose kernel reads its inputs through their
# strides takes the permuted views as they are, and a `.contiguous()` before it would only
# add a copy (lesson 07a finds such an op in PyTorch's fused attention).
#
# **Predict.** What do the hidden copies cost? Time `q @ kᵀ` on permuted views and on
# inputs that are already contiguous in (B, H, S, D), with the heads of GPT-2 small (12
# heads of size 64), 128 tokens and a batch of 4, on one thread; then the two copies
# alone. Which copy is dearer, `q`'s or `kᵀ`'s?


# %%
def fastest_ms(fns, repeats=30, clock=time.perf_counter):
    """{name: fastest of `repeats` calls in ms}; the calls take turns, so that a burst of
    load on the machine slows them all alike, and the fastest call is the least disturbed."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()  # warm-up: first-call allocations
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            best[name] = min(best[name], (clock() - t0) * 1e3)
    return best


def heads(shape, gen):
    """A (B, H, S, D) view of a new (B, S, H*D) projection, as in a transformer."""
    b, h, s, d = shape
    return torch.randn(b, s, h * d, generator=gen).view(b, s, h, d).transpose(1, 2)


def layout_times(shape=(4, 12, 128, 64), repeats=30, clock=time.perf_counter):
    """Scores on permuted views and on contiguous (B, H, S, D) copies, and the copies alone,
    on the CPU."""
    gen = torch.Generator().manual_seed(0)
    qv, kv = (heads(shape, gen) for _ in range(2))  # (B, H, S, D) permuted views
    qc, kc = (t.contiguous() for t in (qv, kv))  # (B, H, S, D) contiguous copies
    return fastest_ms({
        "scores, views": lambda: qv @ kv.transpose(-2, -1),
        "scores, contiguous": lambda: qc @ kc.transpose(-2, -1),
        "copy of q": lambda: qv.contiguous(),  # (B, H, S, D): rows of D numbers
        "copy of k^T": lambda: kv.transpose(-2, -1).contiguous(),  # (B, H, D, S): one number at a time
    }, repeats, clock)


times = layout_times()  # B=4, H=12, S=128, D=64
print("B=4 H=12 S=128 D=64, float32, one thread, fastest of 30 calls each:")
for name, ms in times.items():
    print(f"  {name:<19} {ms:.3f} ms")
print(f"scores: views / contiguous {times['scores, views'] / times['scores, contiguous']:.2f}")
print(f"copies: k^T / q {times['copy of k^T'] / times['copy of q']:.2f}")

# %% [markdown]
# Output:
# ```text
# B=4 H=12 S=128 D=64, float32, one thread, fastest of 30 calls each:
#   scores, views       «time» ms
#   scores, contiguous  «time» ms
#   copy of q           «time» ms
#   copy of k^T         «time» ms
# scores: views / contiguous «ratio»
# copies: k^T / q «ratio»
# ```
#
# Timings depend on the machine, hence the placeholders: read the ratios, which keep their
# order from machine to machine. On contiguous (B, H, S, D) inputs both reshapes are views,
# so the scores are one `bmm` with no copy; on the permuted views, the same product first
# waits for two copies, and the views are slower (by how much depends on the CPU and on
# the sizes). The copy of `kᵀ` is the dearer one: the copy of `q` moves whole rows of D
# neighbouring numbers, the copy of `kᵀ` writes along S what it reads H·D cells apart, one
# number at a time. A layout has a price only where an op must copy to get the layout it
# needs, and the profiler is how you find those places.
#
# The same thing happens on the way back. Attention returns (B, H, S, D); the next linear
# layer wants (B, S, H·D). nanoGPT writes `y.transpose(1, 2).contiguous().view(B, T, C)`:
#
# **Predict.** Which of the three steps copies? Do we get `proj` back exactly?

# %%
back = qc.transpose(1, 2)  # (B, S, H, D), a view of qc
print(f"transpose back: contiguous {back.is_contiguous()}  same storage as qc: {same_storage(back, qc)}")
try:
    back.view(B, S, H * D)
except RuntimeError as err:
    print(f"view without contiguous() failed: {first_sentence(err)}")
packed = back.contiguous()  # (B, S, H, D), row-major
merged = packed.view(B, S, H * D)  # (B, S, H*D)
print(f"contiguous() same storage as qc: {same_storage(packed, qc)}  view same storage: "
      f"{same_storage(merged, packed)}")
print(f"merged shape {tuple(merged.shape)}  strides {merged.stride()}  "
      f"equal to proj: {torch.equal(merged, proj)}")

# %% [markdown]
# Output:
# ```text
# transpose back: contiguous False  same storage as qc: True
# view without contiguous() failed: view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces)
# contiguous() same storage as qc: False  view same storage: True
# merged shape (2, 4, 15)  strides (60, 15, 1)  equal to proj: True
# ```
#
# `transpose` is free, `contiguous()` copies, and `view` is free again. Without the
# `contiguous()` the `view` would raise, for the reason above. The values make the round
# trip exactly: layout changes move numbers, they never change them.

# %% [markdown]
# ## 8. Picture it: one storage, three readers
#
# Label every storage cell with its own position, then read it back through a view with
# the same sizes, strides and offset: each value tells you which cell that index reads.
#
# **Predict.** For `x`, `y = x.t()` and the slice `s = x[:, 1:]`, which storage cell does
# each index read, and which cells does the slice never touch?


# %%
def storage_map(t):
    """{storage position: index} for every element of t, found by asking PyTorch."""
    probe = torch.arange(len(storage_values(t)))  # cell p holds the value p
    view = probe.as_strided(t.shape, t.stride(), t.storage_offset())  # t's geometry
    return {int(view[idx]): idx for idx in itertools.product(*map(range, t.shape))}


def fmt_index(idx):
    return "[" + ",".join(map(str, idx)) + "]"


def plot_storage_views(views):
    """One row per view: the storage cells, each labelled with the index that reads it."""
    n = max(len(storage_values(t)) for t in views.values())
    fig, axes = plt.subplots(len(views), 1, figsize=(1.0 * n + 1, 1.4 * len(views)), squeeze=False)
    for ax, (name, t) in zip(axes[:, 0], views.items()):
        cells = storage_map(t)
        for p in range(n):
            color = "tab:blue" if p in cells else "0.85"  # grey: a cell this view never reads
            ax.add_patch(Rectangle((p, 0), 1, 1, facecolor=color, alpha=0.4, edgecolor="black"))
            if p in cells:
                ax.text(p + 0.5, 0.5, fmt_index(cells[p]), ha="center", va="center")
        ax.set_xlim(0, n)
        ax.set_ylim(0, 1)
        ax.set_xticks([p + 0.5 for p in range(n)], [str(p) for p in range(n)])
        ax.set_yticks([])
        ax.set_title(f"{name}: shape {tuple(t.shape)}, strides {t.stride()}, offset {t.storage_offset()}")
    axes[-1, 0].set_xlabel("storage position")
    fig.tight_layout()
    return fig


# %%
s = x[:, 1:]  # (2, 2), offset 1
views = {"x": x, "y = x.t()": y, "s = x[:, 1:]": s}
n = len(storage_values(x))  # 6 cells
print("storage position " + "".join(f"{p:>7}" for p in range(n)))
for name, t in views.items():
    cells = storage_map(t)  # '.' marks a cell this view never reads
    labels = [fmt_index(cells[p]) if p in cells else "." for p in range(n)]
    print(f"{name:<16} " + "".join(f"{label:>7}" for label in labels))
fig = plot_storage_views(views)
fig.savefig(HERE / "storage_views.png", dpi=100)
print("saved storage_views.png")

# %% [markdown]
# Output:
# ```text
# storage position       0      1      2      3      4      5
# x                  [0,0]  [0,1]  [0,2]  [1,0]  [1,1]  [1,2]
# y = x.t()          [0,0]  [1,0]  [2,0]  [0,1]  [1,1]  [2,1]
# s = x[:, 1:]           .  [0,0]  [0,1]      .  [1,0]  [1,1]
# saved storage_views.png
# ```
#
# Read one column of the table (or of the figure, `storage_views.png`): storage cell 3 is
# `x[1,0]` and `y[0,1]`, and the slice `s` never reads it. The slice starts at offset 1,
# keeps `x`'s strides (3, 1), and so skips cells 0 and 3. Three records, one set of six
# numbers. `storage_map` does not use the formula of section 1: it asks PyTorch which cell
# each index reads, so the table agrees with the formula only because the formula is right.
# You can check any strided code of your own with the same trick.

# %% [markdown]
# ## Summary
#
# - A strided tensor = storage + (sizes, strides, storage offset, dtype, device). Element
#   `index` lives at `offset + sum(index[k] * stride[k])`, in elements; NumPy's byte
#   strides are those times the itemsize.
# - The record is a C++ `TensorImpl`; a Python tensor is a handle to it. An in-place op
#   hands back the same `TensorImpl` and the same Python object; a view is a new
#   `TensorImpl` over the same storage, sharing the version counter.
# - Transpose, slicing (with steps), `expand`, `detach` and `view` only write a new record:
#   same storage, no copy, and writes through them reach the base (an `expand`ed tensor
#   refuses most in-place writes: its indices share cells).
# - `._base` is autograd's bookkeeping (the root of a chain of views, `None` for `detach`),
#   not something to branch on; a view keeps its whole base alive.
# - A tensor is contiguous when every dimension of size > 1 has the stride a new tensor of
#   its shape would get (the offset does not matter): read in row-major order, it visits
#   consecutive storage cells. Reading storage in increasing order is not enough
#   (`m[:, ::2]`). `view` works only when the new shape can be read with strides (it never
#   copies); `reshape` copies when it must; `contiguous()` copies unless the tensor already
#   is contiguous, in which case it returns the tensor itself.
# - A memory format is a choice of strides for the same shape: `channels_last` stores
#   (N, C, H, W) with channels innermost. Elementwise ops, convolution and pooling keep it;
#   `contiguous()`, and some ops (here softmax over channels, layer norm), return row-major.
# - Attention's (B, S, H, D) → (B, H, S, D) transpose is free, but merging dimensions
#   afterwards needs a copy, and composite ops make it for you: `q @ kᵀ` on the permuted
#   views copies both operands on every call; an op that reads its inputs through their
#   strides would not. On a GPU the same comparison should give the same values and the
#   same two copies, with the copying product slower (unverified on a GPU).

# %% [markdown]
# ## References
#
# - [`torch.Tensor.view`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.view.html): the exact condition under
#   which a view of a strided tensor exists, the one section 5 derives.
# - [`torch.Tensor.stride`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.stride.html),
#   [`torch.Tensor.is_contiguous`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.is_contiguous.html) and
#   [`torch.Tensor.contiguous`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.contiguous.html): the record and
#   the copy.
# - [`torch.reshape`](https://docs.pytorch.org/docs/2.13/generated/torch.reshape.html): a view when it can, a copy when it
#   must.
# - [`torch.Tensor.expand`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.expand.html) and
#   [`torch.as_strided`](https://docs.pytorch.org/docs/2.13/generated/torch.as_strided.html): stride 0, and a view built
#   from any strides you give it.
# - [`torch.Tensor.untyped_storage`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.untyped_storage.html): the
#   flat block of bytes under a tensor.
# - Vaswani et al., [Attention Is All You Need](https://arxiv.org/abs/1706.03762) (2017): the
#   multi-head attention whose (B, S, H, D) layout section 7 transposes.

# %% [markdown]
# ## Read the source
#
# Where PyTorch implements what this lesson showed. Open each file in your editor at the
# line printed: the paths are inside the torch you installed, so the line numbers are
# those of your installation. The stops follow the lesson: the Python class, the C++
# record, the contiguity rule, `reshape`'s choice between a view and a copy, the
# channels-last strides, and the `matmul` that copies the attention layout. The two C++
# files the wheel does not ship are printed as links at your release's tag.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/_tensor.py", "class Tensor(torch._C.TensorBase)",
     "The Python class subclasses `torch._C.TensorBase`, the C++ binding that holds the handle to "
     "the `TensorImpl`: `stride()`, `t()`, `untyped_storage()`, `_base` and `_cdata` are inherited "
     "from it, not defined here. Further down, `__cuda_array_interface__` (CUDA tensors only) turns "
     "a non-contiguous tensor's element strides into byte strides (`s * itemsize`, the NumPy rule "
     "of section 1); for a contiguous one it reports `None`, as that interface asks."),
    ("torch/include/c10/core/TensorImpl.h", "struct C10_API TensorImpl :",
     "The record itself: its data members, near the end of the struct, are `storage_`, "
     "`sizes_and_strides_`, `storage_offset_`, `data_type_` and `device_opt_`, plus "
     "`version_counter_` (the note above `struct C10_API VariableVersion` lists who shares it: a "
     "view, `detach()`) and `pyobj_slot_`, which holds the one Python object of section 2. "
     "`set_sizes_and_strides` rewrites sizes and strides, then `refresh_contiguous()` caches "
     "in the bit `is_contiguous_` what `is_contiguous()` returns."),
    ("torch/include/c10/core/Contiguity.h", "bool _compute_contiguous(",
     "Section 3's rule, line for line: an empty tensor is contiguous; walking from the last "
     "dimension, a size-1 dimension is skipped and every other stride must equal the product "
     "of the sizes after it. `TensorImpl::compute_contiguous` (in `c10/core/TensorImpl.cpp`) "
     "applies it to the record's sizes and strides."),
    ("pytorch:aten/src/ATen/native/TensorShape.cpp", "Tensor reshape_symint(",
     "When `reshape` copies: a contiguous input goes straight to `view`; otherwise "
     "`at::detail::computeStride` looks for strides that read the new shape, and `reshape` "
     "returns a view (`_reshape_alias`) when it finds them and `_unsafe_view` of "
     "`self.clone(at::MemoryFormat::Contiguous)`, a copy, when it does not: section 5's "
     "`y.reshape(-1)`."),
    ("torch/include/c10/core/MemoryFormat.h", "std::vector<T> get_channels_last_strides_2d(",
     "The strides a channels-last tensor gets: C gets stride 1, W steps over the C channels, H "
     "over W·C, N over H·W·C, which gives section 6's (60, 1, 15, 3) for a (2, 3, 4, 5) image; "
     "`TensorImpl::empty_tensor_restride` calls it for `MemoryFormat::ChannelsLast`."),
    ("pytorch:aten/src/ATen/native/LinearAlgebra.cpp", "static Tensor _matmul_impl(",
     "`matmul` is this composite: 2-D @ 2-D is one `mm`, and its last branch, for batched "
     "operands, `expand`s both to the common batch shape, `reshape`s each to 3-D for one `bmm` "
     "and `_unsafe_view`s the result back: the six calls section 7 printed, whose two reshapes "
     "copy the permuted (B, H, S, D) views."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/_tensor.py:«line»  `class Tensor(torch._C.TensorBase)`
#     The Python class subclasses `torch._C.TensorBase`, the C++ binding that holds the
#     handle to the `TensorImpl`: `stride()`, `t()`, `untyped_storage()`, `_base` and
#     `_cdata` are inherited from it, not defined here. Further down,
#     `__cuda_array_interface__` (CUDA tensors only) turns a non-contiguous tensor's
#     element strides into byte strides (`s * itemsize`, the NumPy rule of section 1); for
#     a contiguous one it reports `None`, as that interface asks.
# torch/include/c10/core/TensorImpl.h:«line»  `struct C10_API TensorImpl :`
#     The record itself: its data members, near the end of the struct, are `storage_`,
#     `sizes_and_strides_`, `storage_offset_`, `data_type_` and `device_opt_`, plus
#     `version_counter_` (the note above `struct C10_API VariableVersion` lists who shares
#     it: a view, `detach()`) and `pyobj_slot_`, which holds the one Python object of
#     section 2. `set_sizes_and_strides` rewrites sizes and strides, then
#     `refresh_contiguous()` caches in the bit `is_contiguous_` what `is_contiguous()`
#     returns.
# torch/include/c10/core/Contiguity.h:«line»  `bool _compute_contiguous(`
#     Section 3's rule, line for line: an empty tensor is contiguous; walking from the
#     last dimension, a size-1 dimension is skipped and every other stride must equal the
#     product of the sizes after it. `TensorImpl::compute_contiguous` (in
#     `c10/core/TensorImpl.cpp`) applies it to the record's sizes and strides.
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/TensorShape.cpp
#     search for `Tensor reshape_symint(`: When `reshape` copies: a contiguous input goes
#     straight to `view`; otherwise `at::detail::computeStride` looks for strides that
#     read the new shape, and `reshape` returns a view (`_reshape_alias`) when it finds
#     them and `_unsafe_view` of `self.clone(at::MemoryFormat::Contiguous)`, a copy, when
#     it does not: section 5's `y.reshape(-1)`.
# torch/include/c10/core/MemoryFormat.h:«line»  `std::vector<T> get_channels_last_strides_2d(`
#     The strides a channels-last tensor gets: C gets stride 1, W steps over the C
#     channels, H over W·C, N over H·W·C, which gives section 6's (60, 1, 15, 3) for a (2,
#     3, 4, 5) image; `TensorImpl::empty_tensor_restride` calls it for
#     `MemoryFormat::ChannelsLast`.
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/LinearAlgebra.cpp
#     search for `static Tensor _matmul_impl(`: `matmul` is this composite: 2-D @ 2-D is
#     one `mm`, and its last branch, for batched operands, `expand`s both to the common
#     batch shape, `reshape`s each to 3-D for one `bmm` and `_unsafe_view`s the result
#     back: the six calls section 7 printed, whose two reshapes copy the permuted (B, H,
#     S, D) views.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** `x = torch.arange(6).reshape(2, 3)` and `y = x.t()`. Does `y` get memory
#    of its own? Which element of `y` reads the cell that holds `x[1, 0]`, and what happens
#    to `x` when you write through a view?
#
#    <details><summary>Answer</summary>
#
#    No memory of its own: `y` is a new record, shape (3, 2) and strides (1, 3), over the
#    same 48 bytes (`same storage: True`). `x[1, 0]` and `y[0, 1]` both read storage cell 3
#    (*§ A transpose is a new record over the same storage*). A write through a view is a
#    write to the base: multiplying the column view `m[:, 1]` by 10 changed `m` itself
#    (*§ Writing through a view writes the base*).
#
#    </details>
#
# 2. **Predict.** Does `x.reshape(-1)` copy? Does `y.reshape(-1)`, on the transpose? How
#    can you tell, without printing an address?
#
#    <details><summary>Answer</summary>
#
#    `x.reshape(-1)` is a view (`same storage: True`): `x` is contiguous, so one stride
#    reads its cells in order. Flattening `y` must read cells 0, 3, 1, 4, 2, 5, which no
#    single stride does: `y.view(-1)` fails, and `y.reshape(-1)` copies (`same storage:
#    False`; writing `r[0] = 100` left `x[0, 0]` at 0). Here `reshape` copied where `view`
#    raised, and on the contiguous `x` it was a view
#    (*§ `view` needs compatible strides; `reshape` and `contiguous()` may copy*).
#    To tell, compare the storages' start addresses, or write through the result and look
#    at the input.
#
#    </details>
#
# 3. **Explain.** `m[:, ::2]` reads storage cells 0, 2, 4, 6, 8, 10, always forward. Why is
#    it not contiguous, while `m[1:2].t()`, with strides (1, 4), is?
#
#    <details><summary>Answer</summary>
#
#    Contiguous means every dimension of size greater than 1 has the stride a new tensor of
#    the same shape would get. `m[:, ::2]` has strides (4, 2) where a new (3, 2) tensor has
#    (2, 1): it skips cells. `m[1:2].t()` has shape (4, 1); its only dimension of size
#    greater than 1 has stride 1, as a new tensor's would, and the stride 4 of the size-1
#    dimension is never used (*§ A slice is a view with an offset*).
#
#    </details>
#
# 4. **Spot the bug.** A helper modifies its argument in place when `t._base is None`,
#    reasoning that such a tensor is "not a view of anything the caller holds". Which
#    tensors of this lesson prove it wrong?
#
#    <details><summary>Answer</summary>
#
#    `base.detach()` and `torch.from_numpy(base.numpy())` both have `_base` None and share
#    `base`'s storage, so an in-place write to them changes `base`
#    (*§ Writing through a view writes the base*). `_base` is autograd's bookkeeping, not a
#    record of aliasing.
#
#    </details>
#
# 5. **Predict.** The heads are split and moved with `qh = q.transpose(1, 2)`, a free view.
#    Does `qh @ kh.transpose(-2, -1)` copy its inputs? If so, which step copies, and why?
#
#    <details><summary>Answer</summary>
#
#    Yes, both of them. `matmul` is a composite that reshapes both operands to 3-D for one
#    `bmm`; the reshape merges B and H, the merge `view` refused on these strides, so each
#    reshape falls back to a copy (`copies: 2`, 960 bytes here) (*§ The attention layout*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement, in plain Python:
#
# 1. `element_offset(index, strides, offset)`: the storage position of one element.
# 2. `contiguous_strides(shape)`: the strides PyTorch gives a new tensor of that shape
#    (mind sizes 0 and 1).
# 3. `can_view(shape, strides, new_shape)`: does `view(new_shape)` work without a copy?
#    Think in chunks of dimensions that can be merged, and check size-1, size-0 and
#    stride-0 (expanded) dimensions.
#
# Check your answers with `make exercises N=01`: the tests compare each function with
# PyTorch on hundreds of random cases. `solutions.py` has one way to write them.

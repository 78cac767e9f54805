"""Tests of lesson 01: documented outputs, the lesson's key values (every value its prose
states), the contiguity rule on random views, the hidden copies of attention scores on
permuted views and their price, its figure, the exercises (against PyTorch on random
cases), and the attention-layout comparison on a GPU."""

import math
import random
import time

import pytest
import torch


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_transpose_is_a_view(lesson):
    x, y, same = lesson.ns["x"], lesson.ns["y"], lesson.ns["same_storage"]
    assert x.dtype == torch.int64 and x.stride() == (3, 1)
    assert y.shape == (3, 2) and y.stride() == (1, 3) == x.stride()[::-1]
    assert same(x, y) and not y.is_contiguous()
    assert x.untyped_storage().nbytes() == x.numel() * x.element_size() == 48
    assert x[1, 0] == y[0, 1] == 3
    assert x.numpy().strides == tuple(s * x.element_size() for s in x.stride())
    f = lesson.ns["f"]  # float32: byte strides halve, element strides do not change
    assert f.strides == tuple(s // 2 for s in x.numpy().strides)
    assert torch.from_numpy(f).stride() == x.stride()
    a = lesson.ns["a"]  # x.numpy() shares x's memory: a write through the array reaches x
    assert a.ctypes.data == x.data_ptr()


def test_tensor_impl_is_the_record(lesson):
    """Section 2's table: which calls hand back t itself, a new TensorImpl over t's storage,
    or new storage; t_() rewrites t's own record; detach() shares the version counter."""
    ns = lesson.ns
    results, same_impl, same = ns["results"], ns["same_impl"], ns["same_storage"]
    t = results["t.add_(1)"]  # t itself (later cells reuse the name t)
    rows = {name: (u is t, same_impl(u, t), same(u, t)) for name, u in results.items()}
    assert rows == {"t.add_(1)": (True, True, True), "t.t()": (False, False, True),
                    "t.detach()": (False, False, True), "t.clone()": (False, False, False)}
    assert results["t.add_(1)"].note == "set in Python"
    assert t.shape == (3, 2) and t.stride() == (1, 3)  # after t.t_(): same object, new record
    u = torch.zeros(2, 3)
    impl, version = u._cdata, u._version
    assert u.t_() is u and u._cdata == impl and u._version == version + 1  # t_() bumps it too
    d = u.detach()
    d.add_(1)
    assert u._version == version + 2 and d._version == u._version  # one shared counter
    v = u[0]  # (2,) a view of the transposed u
    v.add_(1)
    assert v._version == u._version == version + 3  # views share it as well


def test_slices_have_offsets(lesson):
    row, col, even = lesson.ns["row"], lesson.ns["col"], lesson.ns["even"]
    assert (row.storage_offset(), row.stride()) == (4, (1,))
    assert (col.storage_offset(), col.stride()) == (1, (4,))
    assert even.stride() == (4, 2)
    # the lesson multiplied col by 10 in place: the base m saw it
    m = lesson.ns["m"]
    assert torch.equal(m[:, 1], col) and m[2, 1] == 90


def test_contiguity_examples(lesson):
    """The prose's claims about m[:, ::2], m[2:], m[1:2].t() and y."""
    ns = lesson.ns
    m, positions = ns["m"], ns["positions"]
    even = m[:, ::2]
    assert positions(even) == sorted(positions(even)) == list(range(0, 12, 2))  # forward...
    assert not even.is_contiguous()  # ...and not contiguous: it skips cells
    assert m[2:].storage_offset() == 8 and m[2:].is_contiguous()  # the offset does not matter
    tr = m[1:2].t()  # (4, 1)
    assert tr.shape == (4, 1) and tr.stride() == (1, 4) and tr.is_contiguous()
    assert torch.empty(tr.shape).stride() == (1, 1)  # its size-1 dim's stride differs
    assert torch.empty(ns["y"].shape).stride() == (2, 1) != ns["y"].stride()


def consecutive(positions):
    return positions == list(range(positions[0], positions[0] + len(positions))) if positions else True


def test_contiguity_rule_matches_torch(lesson):
    """contiguous_by_rule, and 'visits consecutive cells in row-major order', agree with
    is_contiguous() on random views and arbitrary strided layouts (stride 0, size 1, size 0)."""
    rule, positions = lesson.ns["contiguous_by_rule"], lesson.ns["positions"]
    rng, seen = random.Random(3), set()
    for k in range(600):
        t = random_tensor(rng) if k % 2 else random_as_strided(rng)
        assert rule(t) == t.is_contiguous(), (tuple(t.shape), t.stride())
        assert consecutive(positions(t)) == t.is_contiguous(), (tuple(t.shape), t.stride())
        seen.add((t.is_contiguous(), t.numel() > 1, any(n == 1 for n in t.shape)))
    assert {(True, True, True), (False, True, True), (True, True, False), (False, True, False)} <= seen


def test_expand_stride_zero(lesson):
    e = lesson.ns["e"]
    assert e.shape == (2, 3) and e.stride() == (0, 1)  # stride 0: row 1 reads row 0's cells
    assert e.untyped_storage().nbytes() == 3 * e.element_size() == 24
    assert e[0].data_ptr() == e[1].data_ptr()
    with pytest.raises(RuntimeError, match=r"(?s)more than one element.*clone"):  # the advice
        e.add_(1)
    for write in (lambda u: u.mul_(2), lambda u: u.copy_(torch.ones(2, 3, dtype=u.dtype))):
        with pytest.raises(RuntimeError, match="more than one element"):
            write(torch.arange(3).expand(2, 3))
    zeroed = torch.arange(3).expand(2, 3).zero_()  # fill_ and zero_ are allowed
    assert zeroed.stride() == (0, 1) and zeroed.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert lesson.ns["filled"].tolist() == [[7] * 3] * 2 and lesson.ns["filled"].stride() == (0, 1)


def test_base_is_bookkeeping(lesson):
    """Section 4's _base table, re-measured: the root of a chain, None for detach and NumPy,
    set by reshape only when it makes a view; a view keeps its whole base alive."""
    ns = lesson.ns
    base, v1, v2, cases, same = ns["base"], ns["v1"], ns["v2"], ns["cases"], ns["same_storage"]
    assert base._base is None and v1._base is base and v2._base is base and v2._base is not v1
    assert cases["base.detach()"]._base is None and same(cases["base.detach()"], base)
    assert cases["torch.from_numpy(base.numpy())"]._base is None
    assert same(cases["torch.from_numpy(base.numpy())"], base)
    assert cases["base.reshape(-1)"]._base is base and cases["base.t().reshape(-1)"]._base is None
    made = cases["torch.arange(12).reshape(3, 4)"]
    assert made._base is not None and made._base.shape == (12,)
    small = ns["small"]
    assert small._base.numel() == 10**6 and small.untyped_storage().nbytes() == 4 * 10**6
    assert small.clone().untyped_storage().nbytes() == 8
    assert type(ns["grown"].grad_fn).__name__ == "CopySlices"
    with torch.inference_mode():
        assert torch.zeros(4)[:2]._base is None  # the prose's pointer to lesson 02


def test_channels_last(lesson):
    """Section 6: same shape and values, other strides; which ops keep the format."""
    ns = lesson.ns
    img, cl, fmt = ns["img"], ns["cl"], ns["memory_format"]
    assert cl.shape == img.shape and torch.equal(cl, img) and not ns["same_storage"](cl, img)
    N, C, H, W = cl.shape
    assert cl.stride() == (H * W * C, 1, W * C, C) and fmt(cl) == "channels_last" and fmt(img) == "row-major"
    formats = {name: fmt(out) for name, out in ns["formats"].items()}
    kept = {"a.relu()", "a * 2", "a + img", "a.clone()", "conv(a)", "F.max_pool2d(a, 2)"}
    assert {n for n, f in formats.items() if f == "channels_last"} == kept
    assert {n for n, f in formats.items() if f == "row-major"} == set(formats) - kept
    assert fmt(torch.zeros(2, 1, 4, 5)) == "both or neither"  # one channel: both at once
    with torch.no_grad():
        for name, out in ns["formats"].items():  # the same values whichever the format
            torch.testing.assert_close(out, ns["format_ops"][name](img))


def test_reshape_copies_and_contiguous(lesson):
    ns = lesson.ns
    x, r, yc, same = ns["x"], ns["r"], ns["yc"], ns["same_storage"]
    assert not same(r, x) and r.tolist()[1:] == [3, 1, 4, 2, 5]
    assert x[0, 0] == 0  # writing r[0] left the base alone
    assert not same(yc, x) and yc.stride() == (2, 1) and torch.equal(yc, ns["y"])
    assert x.contiguous() is x
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        ns["y"].view(-1)


def test_attention_layout(lesson):
    ns = lesson.ns
    B, S, H, D = ns["B"], ns["S"], ns["H"], ns["D"]
    qh, qc, q3 = ns["qh"], ns["qc"], ns["q3"]
    assert qh.shape == (B, H, S, D) and not qh.is_contiguous()
    assert ns["same_storage"](qh, ns["proj"]) and not ns["same_storage"](qc, ns["proj"])
    assert qc.is_contiguous() and torch.equal(qc, qh)
    assert q3.shape == (B * H, S, D) and torch.equal(q3[H + 1], qh[1, 1])  # batch 1, head 1
    assert torch.equal(ns["merged"], ns["proj"])
    back, packed, same = ns["back"], ns["packed"], ns["same_storage"]
    assert same(back, qc) and not same(packed, qc) and same(ns["merged"], packed)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        back.view(B, S, H * D)
    # the prose: merging B and H needs stride(B) == H * stride(H), and 60 != 3 * 5
    assert qh.stride()[:2] == (60, 5) and qh.stride()[0] != H * qh.stride()[1]
    assert qc.numel() * qc.element_size() == ns["nbytes"] == 480
    merged = qh.reshape(B * H, S, D)  # "reshape would do the same copy silently"
    assert not ns["same_storage"](merged, ns["proj"]) and torch.equal(merged, q3)


def test_hidden_copies_of_attention_scores(lesson):
    ns = lesson.ns
    B, S, H, D = ns["B"], ns["S"], ns["H"], ns["D"]
    qh, kh, scores = ns["qh"], ns["kh"], ns["scores"]
    assert (ns["calls"], ns["copied"]) == ns["calls_and_copies"](scores, "aten::matmul")  # what it printed
    calls, copied = ns["calls_and_copies"](scores, "aten::matmul")
    assert calls.count("reshape") == 2 and calls[-2:] == ["bmm", "_unsafe_view"]
    assert copied == [(B, H, S, D), (B, H, D, S)]  # both operands, the second transposed
    # the copies change nothing in the values; on contiguous inputs the reshapes are views
    qc, kc = qh.contiguous(), kh.contiguous()
    calls, copied = ns["calls_and_copies"](lambda: qc @ kc.transpose(-2, -1), "aten::matmul")
    assert copied == [] and "bmm" in calls
    torch.testing.assert_close(scores(), qc @ kc.transpose(-2, -1))


def test_layout_has_a_price(lesson):
    """The printed times exist; re-measured, the scores on permuted views are slower than on
    contiguous inputs, and the copy of k^T (written along one stride, read along another) is
    slower than the copy of q (rows of D numbers). Robust to a loaded machine: the calls take
    turns, the clock is the thread's CPU time (time spent waiting for a core does not count),
    and each time is the fastest of 100 calls spread over two windows. Measured (2 loaded
    cores, AVX-512, AVX2 and no-vector kernels): scores 2.3-2.5x, copies 1.5-6.8x."""
    assert set(lesson.ns["times"]) == {"scores, views", "scores, contiguous", "copy of q", "copy of k^T"}
    runs = [lesson.ns["layout_times"](repeats=50, clock=time.thread_time) for _ in range(2)]
    t = {name: min(run[name] for run in runs) for name in runs[0]}
    assert t["scores, views"] > t["scores, contiguous"], t
    assert t["copy of k^T"] > t["copy of q"], t


def cell_texts(ax):
    """{storage position: label} of the texts drawn in one row of the figure."""
    return {round(t.get_position()[0] - 0.5): t.get_text() for t in ax.texts}


def test_figure_shows_storage_map(lesson):
    ns = lesson.ns
    views, fmt, storage_map = ns["views"], ns["fmt_index"], ns["storage_map"]
    fig = ns["plot_storage_views"](views)
    axes = fig.get_axes()
    assert len(axes) == len(views) == 3
    for ax, (name, t) in zip(axes, views.items()):
        expected = {p: fmt(idx) for p, idx in storage_map(t).items()}
        assert cell_texts(ax) == expected
        assert ax.get_title().startswith(f"{name}: shape {tuple(t.shape)}, strides {t.stride()}")
        assert len(ax.patches) == ns["x"].numel()  # one rectangle per storage cell
    assert axes[-1].get_xlabel() == "storage position"
    # the slice x[:, 1:] skips cells 0 and 3; the transpose reads cell 3 as [0,1]
    assert sorted(storage_map(ns["s"])) == [1, 2, 4, 5]
    assert storage_map(ns["y"])[3] == (0, 1)
    assert (ns["HERE"] / "storage_views.png").is_file()


# ----------------------------------------------------------------------------------------
# Exercises: random tensors made by chains of real view ops, checked against PyTorch


def random_shape(rng, max_dims=4):
    sizes = [0] * 1 + [1] * 3 + [2] * 4 + [3] * 3 + [4] * 2  # size 0 now and then
    return tuple(rng.choice(sizes) for _ in range(rng.randint(0, max_dims)))


def random_view(rng, t):
    """t after one random view op: permute, strided slice, unsqueeze+expand, or narrow."""
    op = rng.choice(["permute", "slice", "expand", "unsqueeze", "narrow"])
    if t.dim() == 0 or op == "unsqueeze":
        return t.unsqueeze(rng.randint(0, t.dim()))
    d = rng.randrange(t.dim())
    if op == "permute":
        return t.permute(rng.sample(range(t.dim()), t.dim()))
    if op == "slice":
        idx = [slice(None)] * t.dim()
        idx[d] = slice(rng.randint(0, 1), None, rng.choice([1, 2, 3]))  # step > 1: gaps
        return t[tuple(idx)]
    if op == "expand":
        t = t.unsqueeze(d)  # a new size-1 dim, then stride 0 along it
        return t.expand(*t.shape[:d], rng.choice([1, 2, 3]), *t.shape[d + 1 :])
    n = t.shape[d]
    return t.narrow(d, rng.randint(0, n // 2), n - n // 2) if n else t


def random_tensor(rng):
    """A view of torch.arange(N) (so each element's value is its storage position)."""
    shape = random_shape(rng, max_dims=3)
    t = torch.arange(math.prod(shape)).reshape(shape)
    for _ in range(rng.randint(0, 4)):
        t = random_view(rng, t)
    return t


def random_as_strided(rng):
    """Arbitrary sizes and strides (overlaps and stride 0 included) over a big storage."""
    shape = random_shape(rng)
    strides = tuple(rng.choice([0, 1, 1, 2, 3, 4, 6, 8, 12]) for _ in shape)
    return torch.empty(200, dtype=torch.int8).as_strided(shape, strides)


def factorize(rng, numel):
    """A random shape with numel elements: numel's prime factors dealt into random dims."""
    if numel == 0:
        shape = list(random_shape(rng, max_dims=3)) + [0]
        rng.shuffle(shape)
        return tuple(shape)
    factors, n, p = [], numel, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    dims = [1] * rng.randint(1, 4)
    for f in factors:
        dims[rng.randrange(len(dims))] *= f
    return tuple(dims)


def new_shapes(rng, t):
    numel = t.numel()
    shapes = [factorize(rng, numel) for _ in range(3)]
    shapes.append(factorize(rng, numel + rng.choice([1, 2, numel or 1])))  # wrong numel
    return shapes


def torch_can_view(t, new_shape):
    try:
        t.view(new_shape)
        return True
    except RuntimeError:
        return False


def view_cases(seed=0, n=500):
    """[(shape, strides, new_shape)] from real view chains and from as_strided layouts."""
    rng, cases = random.Random(seed), []
    for k in range(n):
        t = random_tensor(rng) if k % 3 else random_as_strided(rng)
        cases += [(tuple(t.shape), t.stride(), s) for s in new_shapes(rng, t)]
    return cases


# Hand-picked (shape, strides, new_shape) that catch plausible wrong answers; the expected
# answer is always PyTorch's, never typed here.
HAND_PICKED = {
    "contiguous-merge": ((2, 3, 4), (12, 4, 1), (6, 4)),
    "contiguous-split": ((6, 4), (4, 1), (2, 3, 2, 2)),
    "transpose-flatten": ((3, 2), (1, 3), (6,)),
    "transpose-add-1": ((3, 2), (1, 3), (3, 1, 2)),
    "transpose-split-inner": ((4, 6), (1, 4), (4, 2, 3)),
    "transpose-split-outer": ((4, 6), (1, 4), (2, 2, 6)),
    "transpose-bad-split": ((4, 6), (1, 4), (2, 12)),
    "size1-odd-stride": ((3, 1, 4), (4, 99, 1), (12,)),
    "size1-last-odd-stride": ((2, 3, 1), (3, 1, 5), (6,)),
    "size1-stride-looks-contiguous": ((2, 1, 3), (1, 3, 2), (6,)),
    "strided-1d-split": ((6,), (2,), (2, 3)),
    "strided-1d-merge-fail": ((2, 3), (6, 2), (6,)),
    "strided-merge-ok": ((2, 3), (12, 4), (6,)),
    "expand-merge": ((3, 4), (0, 1), (12,)),
    "expand-split": ((3, 4), (0, 1), (3, 2, 2)),
    "expand-inner-merge": ((4, 3), (1, 0), (12,)),
    "expand-inner-split": ((4, 3), (1, 0), (2, 2, 3)),
    "expand-scalar-merge": ((3, 4), (0, 0), (12,)),
    "zero-numel-any": ((0, 3), (1, 7), (3, 0, 5)),
    "zero-numel-transposed": ((2, 0, 3), (1, 5, 2), (6, 0)),
    "zero-numel-mismatch": ((0, 3), (3, 1), (4,)),
    "scalar-to-1x1": ((), (), (1, 1)),
    "one-to-scalar": ((1,), (5,), ()),
    "numel-mismatch": ((2, 3), (3, 1), (5,)),
    "numel-mismatch-big": ((2, 3), (3, 1), (7,)),
    "permute-merge-inner-pair": ((2, 3, 4), (12, 1, 3), (2, 12)),
    "permute-merge-outer-pair": ((2, 3, 4), (4, 8, 1), (6, 4)),
}


def strided(shape, strides):
    return torch.empty(500, dtype=torch.int8).as_strided(shape, strides)


@pytest.mark.exercise("can_view")
@pytest.mark.parametrize("case", HAND_PICKED.values(), ids=HAND_PICKED.keys())
def test_can_view_hand_picked(exercise_module, case):
    shape, strides, new_shape = case
    expected = torch_can_view(strided(shape, strides), new_shape)
    assert exercise_module.can_view(shape, strides, new_shape) == expected, case


@pytest.mark.exercise("can_view")
def test_can_view_matches_torch(exercise_module):
    cases = view_cases()
    wrong = []
    for shape, strides, new_shape in cases:
        expected = torch_can_view(strided(shape, strides), new_shape)
        if exercise_module.can_view(shape, strides, new_shape) != expected:
            wrong.append(f"shape {shape} strides {strides} -> {new_shape}: torch says {expected}")
    assert not wrong, f"{len(wrong)} of {len(cases)} cases differ, e.g.\n" + "\n".join(wrong[:8])


def test_view_cases_are_varied():
    """The random cases must exercise every rule, or test_can_view_matches_torch proves little."""
    cases = view_cases()
    outcomes = [torch_can_view(strided(a, b), c) for a, b, c in cases]
    same_numel = [o for (a, _, c), o in zip(cases, outcomes) if math.prod(a) == math.prod(c)]
    assert len(cases) >= 1500
    assert sum(same_numel) > 300 and same_numel.count(False) > 100
    assert sum(1 for a, b, _ in cases if 0 in b and math.prod(a) > 1) > 100  # stride 0
    assert sum(1 for a, _, _ in cases if 0 in a) > 50  # zero elements
    assert sum(1 for a, _, _ in cases if 1 in a) > 300  # size-1 dims


@pytest.mark.exercise("element_offset")
def test_element_offset_matches_torch(exercise_module):
    rng, checked = random.Random(1), 0
    for _ in range(400):
        t = random_tensor(rng)
        if t.numel() == 0:
            continue
        for _ in range(3):
            index = tuple(rng.randrange(n) for n in t.shape)
            got = exercise_module.element_offset(index, t.stride(), t.storage_offset())
            assert got == t[index].item(), (tuple(t.shape), t.stride(), t.storage_offset(), index)
            checked += 1
    assert checked > 600


@pytest.mark.exercise("element_offset")
@pytest.mark.parametrize(
    "shape, strides, offset, index",
    [
        ((2, 3), (3, 1), 5, (0, 0)),  # the offset alone: forgetting it gives 0
        ((3, 3), (4, 1), 1, (2, 2)),  # the last element of m[:, 1:] for a 3x4 m
        ((3, 2), (1, 3), 0, (2, 1)),  # a transpose: strides are not shape-derived
        ((4, 3), (1, 0), 2, (3, 2)),  # stride 0: the index along it does not matter
        ((), (), 7, ()),  # 0-d tensor
    ],
)
def test_element_offset_hand_picked(exercise_module, shape, strides, offset, index):
    t = torch.arange(100).as_strided(shape, strides, offset)
    assert exercise_module.element_offset(index, strides, offset) == t[index].item()


@pytest.mark.exercise("contiguous_strides")
def test_contiguous_strides_matches_torch(exercise_module):
    rng = random.Random(2)
    shapes = [(), (0,), (1,), (5,), (2, 0, 3), (3, 0), (0, 0), (4, 1), (1, 4), (2, 1, 3), (2, 0, 1, 3)]
    shapes += [random_shape(rng, max_dims=5) for _ in range(300)]
    for shape in shapes:
        assert exercise_module.contiguous_strides(shape) == torch.empty(shape).stride(), shape


# ----------------------------------------------------------------------------------------
# GPU: section 7's comparison on the device. Written without a GPU at hand: unverified there.


def fastest_gpu_ms(fns, sync, repeats=20):
    """{name: fastest of `repeats` calls in ms}, the calls taking turns; the GPU runs
    asynchronously, so the clock stops only after sync()."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    sync()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best


@pytest.mark.parametrize(
    "device",
    [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("mps", marks=pytest.mark.mps)],
)
def test_attention_layout_on_gpu(lesson, device, record_property):
    sync = torch.cuda.synchronize if device == "cuda" else torch.mps.synchronize
    B, H, S, D = 64, 16, 64, 64  # short sequences: the copies weigh as much as the product
    gen = torch.Generator().manual_seed(0)

    def heads():  # (B, H, S, D) permuted view; small integers: every sum is exact in float32
        proj = torch.randint(-8, 8, (B, S, H * D), generator=gen).float().to(device)  # (B, S, H*D)
        return proj.view(B, S, H, D).transpose(1, 2)

    q, k = heads(), heads()
    qc, kc = q.contiguous(), k.contiguous()  # (B, H, S, D) contiguous
    scores = lambda: q @ k.transpose(-2, -1)  # noqa: E731
    _, copied = lesson.ns["calls_and_copies"](scores, "aten::matmul")
    assert copied == [(B, H, S, D), (B, H, D, S)]  # the same two hidden copies as on the CPU
    assert torch.equal(scores(), qc @ kc.transpose(-2, -1))
    t = fastest_gpu_ms({"views": scores, "contiguous": lambda: qc @ kc.transpose(-2, -1)}, sync)
    print(f"{device}: scores on views {t['views']:.3f} ms, contiguous {t['contiguous']:.3f} ms, "
          f"ratio {t['views'] / t['contiguous']:.2f}")
    shape = f"B={B} H={H} S={S} D={D} fp32"
    record_property(f"{device} q @ k^T on permuted views, {shape} [ms]", round(t["views"], 4))
    record_property(f"{device} q @ k^T on contiguous inputs, {shape} [ms]", round(t["contiguous"], 4))
    record_property(f"{device} permuted / contiguous [ratio]", round(t["views"] / t["contiguous"], 3))
    assert t["views"] > t["contiguous"], t

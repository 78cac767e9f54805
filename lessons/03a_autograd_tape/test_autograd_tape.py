"""Tests of lesson 03a: documented outputs, the lesson's key values (tape vs PyTorch, XOR
training and its figure, graph sizes and saved tensors, version counters, the no_grad trap,
zero_grad, gradcheck's precision), and the tape exercise (against PyTorch on random cases)."""

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scripts.checker import read_cells

def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_xor_worked_example(lesson):
    ns = lesson.ns
    P = ns["XOR_PARAMS"]
    loss, grads = ns["xor_ours"](P)
    loss_ref, grads_ref = ns["xor_torch"](P)
    # the prose's derivation, from the parameters: pre-activations (0.5, -0.3), logit 0.45
    pre = ns["x_xor"] @ P["W1"] + P["b1"]
    np.testing.assert_allclose(pre, [[0.5, -0.3]], rtol=1e-15)
    z = pre[0, 0] * P["w2"][0, 0] + P["b2"][0]
    assert abs(z - 0.45) < 1e-15
    dz = 1 / (1 + np.exp(-z)) - 1  # dL/dz = sigmoid(z) - y
    want = {"W1": [[dz * P["w2"][0, 0], 0.0], [0.0, 0.0]], "b1": [dz * P["w2"][0, 0], 0.0],
            "w2": [[dz * pre[0, 0]], [0.0]], "b2": [dz]}
    assert abs(loss - np.log1p(np.exp(-z))) < 1e-15
    for k in grads:
        assert grads[k].shape == P[k].shape
        np.testing.assert_allclose(grads[k], want[k], rtol=1e-14, atol=0)
        np.testing.assert_array_equal(grads[k] == 0, np.asarray(want[k]) == 0)  # exact zeros
        assert np.abs(grads[k] - grads_ref[k]).max() < 1e-15  # the printed bound
    assert ns["xor_gap"] < 1e-15 and ns["same_zeros"]
    # the printed sigmoid comparison: not bitwise equal everywhere, equal to rounding
    assert (ns["sig_ours"] != ns["sig_torch"]).any() and ns["sig_gap"] < 1e-15


def test_random_networks_agree_to_rounding(lesson):
    ns = lesson.ns
    gap, g_max = ns["gap_random"], ns["g_max"]
    assert round(g_max, 2) == 4.15 and ns["ulp"] == np.spacing(g_max) == 2.0**-50  # in [4, 8)
    # the printed bound: 2 ulps of the largest gradient (1.8e-15; 7e-16 measured on AVX-512,
    # AVX2 and no-vector kernels alike); not zero, so that the comparison is a real one
    assert 0 < gap <= 2 * ns["ulp"]
    gap_1, g_max_1 = ns["largest_gap"](n_cases=30, seed=1)
    assert gap_1 <= 2 * np.spacing(g_max_1)


def test_the_gap_comes_from_matmul_and_sigmoid(lesson):
    """The printed "bitwise equal True" with PyTorch's matmul and sigmoid swapped in, and that
    both are needed (the Summary: not bit for bit because the libraries round some sums and
    products differently). Measured on AVX-512, AVX2 and no-vector kernels alike: the gap
    4.4e-16 (8.9e-16 without vectors) with our tape; 2.2e-16 (2.8e-16) with PyTorch's matmul
    alone, still 4.4e-16 with its sigmoid alone; 0 with both."""
    ns = lesson.ns
    T = ns["Tensor"]
    assert ns["gap_swapped"] == 0
    assert (T.__matmul__, T.bce_with_logits) == ns["tape_ops"]  # the lesson put its tape back
    assert T.__matmul__ is not ns["matmul_by_torch"]
    gaps = {}
    for name, attr in (("matmul", "__matmul__"), ("sigmoid", "bce_with_logits")):
        swapped = {"matmul": ns["matmul_by_torch"], "sigmoid": ns["bce_by_torch"]}[name]
        original = getattr(T, attr)
        setattr(T, attr, swapped)
        try:
            gaps[name] = ns["largest_gap"]()[0]
        finally:
            setattr(T, attr, original)
    assert gaps["matmul"] > 0 and gaps["sigmoid"] > 0, gaps  # each one alone leaves a gap


def test_xor_training(lesson):
    ns = lesson.ns
    losses, probs, right = ns["xor_losses"], ns["xor_probs"], ns["xor_right"]
    assert len(losses) == 500 and abs(losses[0] - np.log(2)) < 0.05  # starts near log 2
    assert losses[0] / losses[-1] > 200 and ns["xor_miss"] < 0.01  # the prose's two claims
    assert ((probs > 0.5) == (ns["XOR_Y"].ravel() == 1)).all()
    # all right from step 11 on, not before, with the loss still near 0.5 then
    k = ns["xor_settled"]
    assert all(right[k:]) and not right[k - 1] and abs(losses[k] - 0.5) < 0.05
    # the curve flattens: each 50-step window divides the loss by less than the one before
    ratios = [losses[i] / losses[i + 50] for i in range(0, 450, 50)]
    assert all(a > b > 1 for a, b in zip(ratios, ratios[1:]))
    assert ns["first50"] == ratios[0] and ns["last50"] == losses[449] / losses[499] > 1
    # the tape's training equals the same network trained with PyTorch's autograd
    arrays = {k: torch.tensor(a, requires_grad=True) for k, a in ns["init_xor"]().items()}
    X, Y = torch.tensor(ns["XOR_X"]), torch.tensor(ns["XOR_Y"])
    for step in range(50):
        z = torch.relu(X @ arrays["W1"] + arrays["b1"]) @ arrays["w2"] + arrays["b2"]
        loss = F.binary_cross_entropy_with_logits(z, Y)
        assert abs(loss.item() - losses[step]) < 1e-12, step
        loss.backward()
        with torch.no_grad():
            for a in arrays.values():
                a -= 0.5 * a.grad
                a.grad = None


def test_xor_figure(lesson):
    ns = lesson.ns
    fig = ns["plot_xor_loss"](ns["xor_losses"])
    (ax,) = fig.get_axes()
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == ns["xor_losses"] and ax.get_yscale() == "log"
    assert "step" in ax.get_xlabel() and "cross-entropy" in ax.get_ylabel()
    assert "XOR" in ax.get_title()
    assert (ns["HERE"] / "xor_loss.png").is_file()


def test_the_tape_is_about_60_lines(course_lesson):
    """The prose's "about 60 lines of NumPy": the cell that holds the whole tape."""
    (cell,) = [c for c in read_cells(course_lesson.script) if c.kind == "code" and "class Tensor" in c.source]
    assert 50 <= len(cell.source.splitlines()) <= 62


def test_lesson_tape_passes_the_exercise_checks(lesson):
    for case in range(40):
        check_tape(lesson.ns["Tensor"], np.random.default_rng(100 + case))
    check_deep_chain(lesson.ns["Tensor"])
    check_diamonds(lesson.ns["Tensor"])


def test_recorded_graph(lesson):
    ns = lesson.ns
    assert ns["graph_sizes"] == {1: 3, 3: 7}
    assert ns["h_nograd"].grad_fn is None and not ns["h_nograd"].requires_grad
    names = []

    def walk(fn):
        names.append(type(fn).__name__)
        for nxt, _ in fn.next_functions:
            if nxt is not None:
                walk(nxt)

    walk(ns["z"].grad_fn)
    assert names == ["MmBackward0", "ReluBackward0", "MmBackward0", "AccumulateGrad", "AccumulateGrad"]
    # what the nodes keep: both factors of the product, the ReLU's output, nothing for +
    mm, relu = ns["z"].grad_fn, ns["relu_fn"]
    assert torch.equal(mm._saved_self, relu._saved_result) and torch.equal(mm._saved_mat2, ns["w2"])
    assert ns["saved"](relu) == ["result"] and ns["saved"]((ns["w2"] + 1).grad_fn) == []
    assert ns["mm_first"].next_functions[0][0] is None  # x1 needs no gradient


def test_version_counter(lesson):
    ns = lesson.ns
    assert ns["alias"]._version == 1 and ns["copy"]._version == 1
    assert ns["x_hooked"].grad.item() == 12.0  # what the check prevents: 2 * 6, silently
    assert ns["grad_history"] == [6.0, 12.0]  # .grad accumulates: x^2 at 3, twice
    # a view shares the counter too (the prose: "shared with its views")
    t = torch.zeros(3)
    v = t[:2]
    t.add_(1)
    assert v._version == t._version == 1
    x = torch.tensor([3.0], requires_grad=True)
    y = x * x
    x.detach().add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_leaf_in_place_and_the_no_grad_trap(lesson):
    ns = lesson.ns
    w, w_ok, x = ns["w_leaf"], ns["w_ok"], ns["x_in"]
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        torch.ones(2, requires_grad=True).mul_(2)
    u = w_ok.detach() / w_ok.detach().norm()
    torch.testing.assert_close(w, u)  # the no_grad write overwrote the parameter
    assert torch.equal(w.grad, x)  # the gradient of w @ x, normalisation ignored
    right = (x - u * (u @ x)) / w_ok.detach().norm()  # the prose's formula
    torch.testing.assert_close(w_ok.grad, right)
    assert abs((w_ok.grad @ w_ok.detach()).item()) < 1e-6  # perpendicular to w


def test_zero_grad_and_the_optimizer(lesson):
    ns = lesson.ns
    assert (ns["decay_none"], ns["decay_zeros"]) == (False, True)
    assert inspect.signature(torch.nn.Module.zero_grad).parameters["set_to_none"].default is True


def test_gradcheck_precision(lesson):
    ns = lesson.ns
    err = ns["fd_err"]
    assert err[torch.float64] < 1e-9 < 1e-2 < err[torch.float32]
    assert ns["ok"] is True and ns["ok32"] is False
    assert ns["GC_DEFAULTS"] == {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3}  # the prose's values


# ----------------------------------------------------------------------------------------
# Exercise: the NumPy tape, against PyTorch's autograd


def torch_unbroadcast(grad, shape):
    """PyTorch's answer: the gradient of sum(grad * broadcast(t)) with respect to t."""
    t = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    (torch.broadcast_to(t, grad.shape) * torch.from_numpy(grad)).sum().backward()
    return t.grad.numpy()


UNBROADCAST_CASES = {
    "same": ((2, 3), (2, 3)),
    "leading": ((4, 3), (3,)),
    "two-leading": ((2, 4, 3), (3,)),
    "size-1-last": ((4, 3), (4, 1)),
    "size-1-first": ((4, 3), (1, 3)),
    "both": ((2, 4, 3), (4, 1)),
    "size-1-and-leading": ((5, 2, 4, 3), (1, 4, 1)),
    "to-scalar": ((2, 3), ()),
    "to-1": ((2, 3), (1,)),
    "keeps-size-1": ((3, 1), (3, 1)),
    "scalar-grad": ((), ()),
}


@pytest.mark.exercise("unbroadcast")
@pytest.mark.parametrize("case", UNBROADCAST_CASES.values(), ids=UNBROADCAST_CASES.keys())
def test_unbroadcast_hand_picked(exercise_module, case):
    grad_shape, shape = case
    grad = np.random.default_rng(0).normal(size=grad_shape)
    before = grad.copy()
    got = exercise_module.unbroadcast(grad, shape)
    assert np.shape(got) == shape, f"shape {np.shape(got)}, expected {shape}"
    np.testing.assert_allclose(got, torch_unbroadcast(grad, shape), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(grad, before)  # the input is left alone


def random_broadcast_pair(rng):
    """(grad shape, input shape): the input drops some leading dims and sets some to 1."""
    out = tuple(int(n) for n in rng.integers(1, 5, size=rng.integers(0, 5)))
    keep = rng.integers(0, len(out) + 1)
    shape = tuple(1 if rng.random() < 0.4 else n for n in out[len(out) - keep :])
    return out, shape


@pytest.mark.exercise("unbroadcast")
def test_unbroadcast_random(exercise_module):
    rng = np.random.default_rng(1)
    for _ in range(300):
        grad_shape, shape = random_broadcast_pair(rng)
        grad = rng.normal(size=grad_shape)
        got = exercise_module.unbroadcast(grad, shape)
        assert np.shape(got) == shape, (grad_shape, shape)
        np.testing.assert_allclose(got, torch_unbroadcast(grad, shape), rtol=1e-12, atol=1e-12,
                                   err_msg=f"grad {grad_shape} -> {shape}")


def torch_bce(z, y):
    return F.binary_cross_entropy_with_logits(z, torch.from_numpy(y))


def tape_bce(z, y):
    return z.bce_with_logits(y)


def network(leaf, bce, c):
    """One random-shaped network, written once for both tapes: `leaf` makes a leaf tensor.

    Uses: leading-dim and size-1 broadcasting in both directions, a weight used twice, an
    activation read by two paths of different lengths, and a 3-D result.
    """
    x, W, b, V, c3, u = (leaf(c[k]) for k in ("x", "W", "b", "V", "c3", "u"))
    h = (x @ W + b).relu()  # (N, K): b is one of (K,), (1, K), (N, 1), (1, 1), ()
    h2 = (h @ W + b).relu()  # W and b used twice
    s = h2 @ V + (h @ V).relu()  # h read by two paths: (N, M)
    out = s + c3  # c3 (L, 1, M) or (L, N, 1): (L, N, M)
    return bce(out + u, c["y"]), [x, W, b, V, c3, u]  # u: (M,) or (1, 1, 1)


def random_network_case(rng):
    N, K, M, L = (int(n) for n in rng.integers(1, 5, size=4))
    bias = [(K,), (1, K), (N, 1), (1, 1), ()][rng.integers(5)]
    c3 = [(L, 1, M), (L, N, 1), (1, N, M)][rng.integers(3)]
    u = [(M,), (1, 1, 1), (1, M)][rng.integers(3)]
    c = {"x": rng.normal(size=(N, K)), "W": rng.normal(size=(K, K)) / K**0.5,
         "b": np.asarray(rng.normal(size=bias)), "V": rng.normal(size=(K, M)), "c3": rng.normal(size=c3),
         "u": rng.normal(size=u)}
    out = np.broadcast_shapes((N, M), c3, u)  # (L, N, M) or (1, N, M)
    c["y"] = rng.integers(0, 2, size=out).astype(np.float64)
    return c


def check_tape(Tensor, rng, case=None):
    """Loss and every leaf gradient of Tensor's tape equal PyTorch's on one random network."""
    c = random_network_case(rng) if case is None else case
    loss, ours = network(Tensor, tape_bce, c)
    loss.backward()
    ref, theirs = network(lambda a: torch.tensor(a, requires_grad=True), torch_bce, c)
    ref.backward()
    shapes = {k: c[k].shape for k in ("x", "W", "b", "V", "c3", "u")}
    assert np.shape(loss.data) == () and abs(float(loss.data) - ref.item()) < 1e-12, shapes
    for name, a, b in zip(shapes, ours, theirs):
        assert a.grad is not None and np.shape(a.grad) == tuple(b.shape), (name, shapes)
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=f"gradient of {name}, shapes {shapes}")


def check_deep_chain(Tensor, depth=3000):
    """A chain deeper than Python's recursion limit: one bias added 3000 times."""
    b = Tensor(np.array([1e-3]))  # (1,)
    h = Tensor(np.zeros((2, 1)))  # (2, 1)
    for _ in range(depth):
        h = h + b  # b broadcast to (2, 1), and used 3000 times
    h.bce_with_logits(np.ones((2, 1))).backward()  # logits 3.0, labels 1
    sigmoid = 1 / (1 + np.exp(-depth * 1e-3))
    np.testing.assert_allclose(b.grad, [depth * (sigmoid - 1)], rtol=1e-9)  # 2 rows / mean of 2


def check_diamonds(Tensor, depth=40):
    """40 stacked diamonds: u = h + c, then h' = h + u, so h reaches h' along two paths of
    different lengths and the input reaches the loss along 2**40 paths. A backward that
    follows paths calls some grad_fn twice: the first repeated call fails at once, instead
    of running for days. One that runs h before u (breadth-first: h is h's first parent)
    misses u's share of h's gradient."""
    h0, c = Tensor(np.array([[0.5]])), Tensor(np.array([[0.0]]))  # (1, 1) each
    h = h0
    for _ in range(depth):
        h = h + (h + c)  # d h'/d h = 2
    loss = h.bce_with_logits(np.zeros((1, 1)))  # logit 0.5 * 2**40: sigmoid 1, dL/dlogit 1
    calls, stack, seen = {}, [loss], set()
    while stack:  # wrap every grad_fn in the graph with a once-only guard
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.extend(t.parents)
        if t.grad_fn is not None:
            t.grad_fn = once(t.grad_fn, calls, id(t))
    loss.backward()
    assert len(calls) == 2 * depth + 1, f"{len(calls)} grad_fns ran, expected {2 * depth + 1}"
    np.testing.assert_array_equal(h0.grad, [[2.0**depth]])
    np.testing.assert_array_equal(c.grad, [[2.0**depth - 1]])  # 1 + 2 + ... + 2**(depth-1)


def once(fn, calls, key):
    def wrapped(g):
        assert key not in calls, ("a grad_fn ran twice: backward must visit each tensor once, "
                                  "after all the tensors computed from it (reverse topological order)")
        calls[key] = True
        return fn(g)
    return wrapped


@pytest.mark.exercise("Tensor")
def test_tensor_deep_chain(exercise_module):
    """3000 operations in a chain: a recursive backward hits Python's recursion limit."""
    check_deep_chain(exercise_module.Tensor)


@pytest.mark.exercise("Tensor")
def test_tensor_shared_subgraphs(exercise_module):
    check_diamonds(exercise_module.Tensor)


@pytest.mark.exercise("Tensor")
def test_tensor_xor_worked_example(exercise_module):
    T = exercise_module.Tensor
    x, y = np.array([[1.0, 0.0]]), np.array([[1.0]])
    W1, b1 = T([[0.5, -0.4], [0.3, 0.8]]), T([0.0, 0.1])
    w2, b2 = T([[0.7], [-0.6]]), T([0.1])
    loss = ((T(x) @ W1 + b1).relu() @ w2 + b2).bce_with_logits(y)
    loss.backward()
    assert round(float(loss.data), 4) == 0.4932
    theirs = [torch.tensor(t.data, requires_grad=True) for t in (W1, b1, w2, b2)]
    h = torch.relu(torch.tensor(x) @ theirs[0] + theirs[1])
    torch_bce(h @ theirs[2] + theirs[3], y).backward()
    for ours, ref in zip((W1, b1, w2, b2), theirs):
        np.testing.assert_allclose(ours.grad, ref.grad.numpy(), rtol=1e-12, atol=1e-15)
    assert round(float(W1.grad[0, 0]), 4) == -0.2726 and round(float(b2.grad[0]), 4) == -0.3894


@pytest.mark.exercise("Tensor")
def test_tensor_matches_torch_on_random_networks(exercise_module):
    rng = np.random.default_rng(2)
    for _ in range(150):
        check_tape(exercise_module.Tensor, rng)


@pytest.mark.exercise("Tensor")
def test_tensor_relu_gradient_at_zero(exercise_module):
    """An exactly-zero pre-activation gets gradient 0, as in PyTorch."""
    T = exercise_module.Tensor
    x, W = T(np.array([[1.0, -1.0]])), T(np.array([[1.0], [1.0]]))  # x @ W == 0 exactly
    v = T(np.array([[2.0]]))
    ((x @ W).relu() @ v).bce_with_logits(np.array([[1.0]])).backward()
    assert W.grad.tolist() == [[0.0], [0.0]]
    assert v.grad.tolist() == [[0.0]]  # relu(0) = 0 feeds v


@pytest.mark.exercise("Tensor")
@pytest.mark.parametrize("scale", [30.0, 100.0, 1000.0])
def test_tensor_bce_large_logits(exercise_module, scale):
    """Logits of ±30, ±100 and ±1000 with both labels: finite loss and gradient, equal to PyTorch's."""
    z = np.array([[scale, -scale], [-scale, scale]])  # (2, 2)
    y = np.array([[1.0, 1.0], [0.0, 0.0]])
    t = exercise_module.Tensor(z)
    with np.errstate(over="raise", invalid="raise"):  # an overflow that only warns fails too
        loss = t.bce_with_logits(y)
        loss.backward()
    zt = torch.tensor(z, requires_grad=True)
    ref = torch_bce(zt, y)
    ref.backward()
    assert np.isfinite(loss.data) and abs(float(loss.data) - ref.item()) < 1e-9 * scale
    np.testing.assert_allclose(t.grad, zt.grad.numpy(), rtol=1e-9, atol=1e-15)

"""Tests of lesson 02: documented outputs, the lesson's key values (schemas, dispatch keys,
the op log of a training step, meta tensors, the custom op's stride contract) and the
exercise, against a reference dispatch mode.

The lesson registers its custom ops (course02::double_bad, course02::double_good) once, when
the `lesson` fixture runs the script; these tests use the ops from `lesson.ns` and never
register them again.
"""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

Key = torch._C.DispatchKey


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_schemas_annotate_aliasing(lesson):
    ops = lesson.ns["ops"]
    mm, add_, transpose, add_out = (ops[k]._schema for k in ("mm", "add_", "transpose", "add (out=)"))
    assert all(a.alias_info is None for a in mm.arguments) and mm.returns[0].alias_info is None
    # add_: self is written (a!) and the output is the same memory
    assert add_.arguments[0].alias_info.is_write and add_.returns[0].alias_info.is_write
    assert add_.arguments[0].alias_info.before_set == add_.returns[0].alias_info.before_set
    assert add_.arguments[2].name == "alpha" and add_.arguments[2].kwarg_only
    # transpose: the output aliases self (a), nothing is written
    assert not transpose.arguments[0].alias_info.is_write
    assert transpose.arguments[0].alias_info.before_set == transpose.returns[0].alias_info.before_set
    out = next(a for a in add_out.arguments if a.name == "out")
    assert out.kwarg_only and out.alias_info.is_write
    assert add_out.arguments[0].alias_info is None  # the inputs of add.out are only read


def test_spellings_reach_the_same_overload(lesson):
    ns = lesson.ns
    logs = {}
    for name, fn in ns["spellings"].items():
        with ns["OpLog"]() as log:
            fn()
        logs[name] = log.names()
    assert logs["torch.mm(x, w)"] == logs["x @ w"] == logs["torch.matmul(x, w)"] == ["aten.mm.default"]
    assert logs["F.linear(x, w.t())"][-1] == "aten.mm.default"
    assert "aten.matmul.default" not in sum(logs.values(), [])  # composites never reach a mode


def test_dispatch_keys_and_grad_modes(lesson):
    ns = lesson.ns
    keys = {k: torch._C._dispatch_keys(ns[k]) for k in ("plain", "leaf", "nograd", "infer")}
    assert keys["plain"] == keys["leaf"] == keys["nograd"]  # requires_grad is not a key
    for k in (Key.CPU, Key.AutogradCPU, Key.ADInplaceOrView):
        assert keys["plain"].has(k)
    assert keys["infer"].has(Key.CPU)
    assert not keys["infer"].has(Key.AutogradCPU) and not keys["infer"].has(Key.ADInplaceOrView)
    assert ns["leaf"].requires_grad and not ns["nograd"].requires_grad and ns["nograd"].grad_fn is None
    assert ns["plain"]._version == 2 and ns["infer"].is_inference()
    with pytest.raises(RuntimeError, match="do not track version counter"):
        ns["infer"]._version


def test_training_step_log(lesson):
    ns = lesson.ns
    forward = [str(f) for f, _, _ in ns["forward_calls"]]
    backward = [str(f) for f, _, _ in ns["backward_calls"]]
    assert forward == ["aten.t.default", "aten.addmm.default", "aten._log_softmax.default",
                       "aten.detach.default", "aten.nll_loss_forward.default"]
    assert backward[0] == "aten.ones_like.default"
    assert backward.index("aten.nll_loss_backward.default") < backward.index(
        "aten._log_softmax_backward_data.default") < backward.index("aten.mm.default")
    assert backward.count("aten.detach.default") == 3
    # the logged step computed the right gradients: dL/dlogits = (softmax - onehot) / N
    xs, target, weight, bias = ns["xs"], ns["target"], ns["weight"], ns["bias"]
    logits = xs @ weight.detach().t() + bias.detach()  # (N, C)
    dlogits = (logits.softmax(-1) - F.one_hot(target, 3)) / len(target)  # (N, C)
    torch.testing.assert_close(weight.grad, dlogits.t() @ xs)
    torch.testing.assert_close(bias.grad, dlogits.sum(0))


def test_training_step_log_is_deterministic(lesson):
    ns = lesson.ns
    w, b = ns["weight"].detach().clone().requires_grad_(), ns["bias"].detach().clone().requires_grad_()
    with ns["OpLog"]() as log:
        F.cross_entropy(F.linear(ns["xs"], w, b), ns["target"]).backward()
    assert log.calls == ns["step_log"].calls  # same ops, same shapes, same order


def test_meta_tensors(lesson):
    ns = lesson.ns
    big, mlp, out = ns["big"], ns["mlp"], ns["out"]
    assert big.is_meta and big.numel() == 10**9 and big.data_ptr() == 0
    assert all(p.is_meta for p in mlp.parameters())
    assert ns["n_bytes"] == 4 * ns["n_params"] == 4 * (4096 * 16384 * 2 + 16384 + 4096)
    assert out.is_meta and out.shape == (64, mlp[-1].out_features)
    assert ns["meta_log"].names() == ["aten.t.default", "aten.addmm.default", "aten.gelu.default",
                                      "aten.t.default", "aten.addmm.default"]


def test_custom_op_stride_contract(lesson):
    ns = lesson.ns
    a, bad, good = ns["a"], ns["double_bad"], ns["double_good"]
    assert bad._opoverload is torch.ops.course02.double_bad.default  # registered by the script run
    for op in (bad, good):
        r = op(a)
        assert r.stride() == (1, a.shape[0]) and torch.equal(r, 2 * a)
    fake_strides = {}
    for name, fn in (("bad", ns["flat_bad"]), ("good", ns["flat_good"])):
        graph = make_fx(fn, tracing_mode="fake")(a)
        first = next(n for n in graph.graph.nodes if n.op == "call_function")
        fake_strides[name] = first.meta["val"].stride()
    assert fake_strides == {"bad": (a.shape[1], 1), "good": (1, a.shape[0])}
    assert torch.equal(ns["eager"], (2 * a).reshape(-1))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        torch.compile(ns["flat_bad"], backend="aot_eager")(a)
    assert torch.equal(torch.compile(ns["flat_good"], backend="aot_eager")(a), (2 * a).reshape(-1))


def test_opcheck_catches_the_careless_fake(lesson):
    ns = lesson.ns
    with pytest.raises(Exception, match=r"test_faketensor failed.*Stride mismatch"):
        torch.library.opcheck(ns["double_bad"], (ns["a"],))
    result = torch.library.opcheck(ns["double_good"], (ns["a"].t(),))  # another layout too
    assert set(result.values()) == {"SUCCESS"}


# ----------------------------------------------------------------------------------------
# Exercise: count_aten_ops against a reference mode


class Reference(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten":
            self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def reference_counts(fn, *args):
    with Reference() as ref:
        fn(*args)
    return dict(ref.counts)


def make_args():
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(4, 8, generator=g),  # (N, D)
        "w": torch.randn(3, 8, generator=g),  # (C, D)
        "b": torch.randn(3, generator=g),  # (C,)
        "v": torch.randn(8, generator=g),  # (D,)
    }


# name -> (fn, names of its arguments in make_args()); each catches a plausible slip
CASES = {
    "one-mm": (lambda x, w: torch.mm(x, w.t()), "xw"),  # a t view, then mm
    "matmul-composite": (lambda x, w: x @ w.t(), "xw"),  # no aten.matmul: decomposed
    "linear-with-bias": (lambda x, w, b: F.linear(x, w, b), "xwb"),  # t + addmm, no aten.linear
    "repeated-op": (lambda x, w: (x @ w.t()) @ (w @ x.t()), "xw"),  # counts, not a set
    "overloads": (lambda x, v: (x + v, x + 1, x.sum(), x.sum(0), x.max(), x.max(0)), "xv"),
    "in-place": (lambda x: x.clone().add_(1).mul_(2).relu_(), "x"),  # add_.Tensor, not add.Tensor
    "factory": (lambda v: torch.zeros(8) + torch.ones_like(v) + torch.arange(8), "v"),  # no tensor input
    "python-number": (lambda v: v.sum().item() + v[0].item(), "v"),  # _local_scalar_dense
    "other-namespace": (lambda v: torch.ops.prims.convert_element_type.default(v, torch.float64) + v,
                        "v"),  # prims.* is not aten
    "softmax-loss": (lambda x, w, b: F.cross_entropy(F.linear(x, w, b), torch.tensor([0, 2, 1, 0])),
                     "xwb"),
    "nothing": (lambda v: None, "v"),  # no op at all: {}
}


@pytest.mark.exercise("count_aten_ops")
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_count_aten_ops_matches_reference(exercise_module, case):
    fn, names = case
    args = [make_args()[n] for n in names]
    expected = reference_counts(fn, *args)
    got = exercise_module.count_aten_ops(fn, *args)
    assert isinstance(got, dict) and dict(got) == expected


@pytest.mark.exercise("count_aten_ops")
def test_count_aten_ops_forward_only_with_grad(exercise_module):
    """Inputs that require grad: count what the forward runs, autograd's detach included."""
    args = make_args()
    w = args["w"].requires_grad_()
    fn = lambda x, w, b: F.cross_entropy(F.linear(x, w, b), torch.tensor([0, 2, 1, 0]))  # noqa: E731
    expected = reference_counts(fn, args["x"], w, args["b"])
    assert exercise_module.count_aten_ops(fn, args["x"], w, args["b"]) == expected
    assert w.grad is None  # forward only: nothing ran backward


def test_exercise_cases_are_varied():
    """The cases must tell apart the usual slips, or the exercise tests prove little."""
    counts = {name: reference_counts(fn, *[make_args()[n] for n in names])
              for name, (fn, names) in CASES.items()}
    assert counts["repeated-op"]["aten.mm.default"] == 3
    assert counts["linear-with-bias"] == {"aten.t.default": 1, "aten.addmm.default": 1}
    assert {"aten.sum.default", "aten.sum.dim_IntList", "aten.max.default", "aten.max.dim"} <= set(
        counts["overloads"])
    assert "aten.add_.Tensor" in counts["in-place"] and "aten.zeros.default" in counts["factory"]
    assert counts["python-number"]["aten._local_scalar_dense.default"] == 2
    assert counts["other-namespace"] == {"aten.add.Tensor": 1} and counts["nothing"] == {}

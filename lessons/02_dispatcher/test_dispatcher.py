"""Tests of lesson 02: documented outputs, the lesson's key values (schemas, dispatch keys,
inference_mode per tensor kind, the op log of a training step and what the profiler records
with and without a mode, meta tensors, the custom op's stride contract) and the exercise,
against what really happens (version counters and values, on cases where they can tell),
with plausible wrong answers that the cases must catch.

The lesson registers its custom ops (course02::double_bad, course02::double_good) once, when
the `lesson` fixture runs the script; these tests use the ops from `lesson.ns` and never
register them again.
"""

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
    nll = torch.ops.aten.nll_loss_forward.default._schema  # section 4: "also returns the total weight"
    assert [r.name for r in nll.returns] == ["output", "total_weight"]


def test_schemas_and_kernels_come_from_torchgen(lesson):
    """The yaml's func: line is the schema PyTorch reports, for mul and for other ops; the CPU
    and autograd kernels are registered by generated files, the vmap rule by a hand-written one."""
    ns = lesson.ns
    yaml_entry, native = ns["yaml_entry"], ns["TORCHGEN"] / "ATen/native/native_functions.yaml"
    for name, op in [("mul.Tensor", torch.ops.aten.mul.Tensor), ("mm", torch.ops.aten.mm.default),
                     ("add_.Tensor", torch.ops.aten.add_.Tensor), ("transpose.int", torch.ops.aten.transpose.int)]:
        assert "aten::" + yaml_entry(native, name)[0].removeprefix("func: ") == str(op._schema), name
    assert "structured_delegate: mul.out" in ns["native"]
    assert ns["out_variant"][0].startswith("func: mul.out(") and "CPU, CUDA, MPS, MTIA: mul_out" in ns["out_variant"]
    assert [g.split(":")[0] for g in ns["grads"][1:3]] == ["self", "other"]
    files = ns["kernel_files"]("aten::mul.Tensor")
    assert files["CPU"] == ("RegisterCPU.cpp", True) and files["Autograd[alias]"] == ("VariableType.cpp", True)
    assert files["FuncTorchBatched"] == ("BatchRulesBinaryOps.cpp", False)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::mul.Tensor", "CPU")


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
    top = {name: ns["top_level_ops"](fn) for name, fn in ns["spellings"].items()}  # ...the profiler sees them
    assert top == {"torch.mm(x, w)": ["aten::mm"], "x @ w": ["aten::matmul"],
                   "torch.matmul(x, w)": ["aten::matmul"], "F.linear(x, w.t())": ["aten::t", "aten::linear"]}


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
        ns["infer"]._version  # noqa: B018 - the read itself must raise


def test_inference_mode_per_tensor_kind(lesson):
    """What the prose says inference_mode does, per tensor kind, re-measured here."""
    ns = lesson.ns
    off = ns["off"]
    assert off["no mode"] == off["no_grad"] == {"Autograd": False, "ADInplaceOrView": False, "AutocastCPU": True}
    assert off["autocast"] == {"Autograd": False, "ADInplaceOrView": False, "AutocastCPU": False}
    assert off["inference_mode"] == {"Autograd": True, "ADInplaceOrView": False, "AutocastCPU": True}
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the switch, seen on a real call
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert ns["rows"]["ordinary t"] == ("0 -> 1", True, False, True)
    assert ns["rows"]["inference i"] == ("no counter", False, True, True)
    leaf = ns["leaf"]
    t = torch.zeros(4)
    with torch.inference_mode():
        i = torch.zeros(4)
        t.add_(1)  # ordinary: ADInplaceOrView still bumps the version...
        view = t[:2]  # ...and still records the base
        inferred, product = t * 2, leaf * 2
        assert not torch.is_grad_enabled()
    assert t._version == 1 and view._base is t and not view.is_inference()
    assert i.is_inference() and i[:2]._base is None and inferred.is_inference()
    assert product.grad_fn is None and not product.requires_grad  # autograd off, even for leaf
    assert torch._C._dispatch_keys(view) == torch._C._dispatch_keys(t)  # an ordinary view
    assert not torch._C._dispatch_keys(i[:2]).has(Key.ADInplaceOrView)


def test_training_step_log(lesson):
    ns = lesson.ns
    forward = [str(f) for f, _, _ in ns["forward_calls"]]
    backward = [str(f) for f, _, _ in ns["backward_calls"]]
    assert forward == ["aten.t.default", "aten.addmm.default", "aten._log_softmax.default",
                       "aten.detach.default", "aten.nll_loss_forward.default"]
    assert backward[0] == "aten.ones_like.default"
    assert backward.index("aten.nll_loss_backward.default") < backward.index(
        "aten._log_softmax_backward_data.default") < backward.index("aten.mm.default")
    # what the mode sees: 1 + 3 detaches; 2 of them exist only because a mode is active
    # (test_profiler_shows_the_observer_effect)
    assert forward.count("aten.detach.default") == 1 and backward.count("aten.detach.default") == 3
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


def test_profiler_shows_the_observer_effect(lesson):
    ns = lesson.ns
    plain, watched = ns["profile_step"](), ns["profile_step"](ns["NoOp"]())
    callers = ns["callers"]
    assert callers(plain, "aten::detach") == {"AccumulateGrad": 2}  # with no mode: 2
    assert callers(plain, "aten::addmm") == {"linear": 1}
    assert callers(watched, "aten::detach") == {  # with a mode that changes nothing: 6
        "AccumulateGrad": 2, "PythonDispatchMode": 2, "_log_softmax": 1, "LogSoftmaxBackward0": 1}
    assert callers(watched, "aten::addmm") == {"linear": 1, "PythonDispatchMode": 1}  # recorded twice
    # the OpLog of section 4 saw 4 detaches: autograd's 2 plus the 2 the mode caused
    logged = [str(f) for f, _, _ in ns["step_log"].calls].count("aten.detach.default")
    made_by_mode = sum(n for k, n in callers(watched, "aten::detach").items() if k != "PythonDispatchMode")
    assert logged == made_by_mode == 4
    # gradients are the same with and without the mode: watching changes the calls, not the math
    w1, w2 = (ns["weight"].detach().clone().requires_grad_() for _ in range(2))
    F.cross_entropy(F.linear(ns["xs"], w1, ns["bias"].detach()), ns["target"]).backward()
    with ns["NoOp"]():
        F.cross_entropy(F.linear(ns["xs"], w2, ns["bias"].detach()), ns["target"]).backward()
    assert torch.equal(w1.grad, w2.grad)


def test_shallow_copy_calls_detach_only_under_a_mode(lesson):
    ns = lesson.ns
    assert ns["no_mode_ops"] == [] and ns["data_log"].names() == ["aten.detach.default"]
    t = torch.ones(2)
    with ns["OpLog"]() as log:
        t.detach()  # an explicit detach is an op either way
        t.data  # noqa: B018 - the read itself is what calls detach
    assert log.names() == ["aten.detach.default"] * 2


def test_more_layers(lesson):
    """Section 6's table re-run: what bump sees and which calls reach the mode below."""
    ns = lesson.ns
    rows = {}
    for name, fn in ns["layered"].items():
        ns["seen"] = []  # bump appends to the lesson's global `seen`
        with ns["OpLog"]() as log:
            with ns["FakeTensorMode"]() if name == "fake" else ns["contextlib"].nullcontext():
                fn(torch.zeros(2, 3))
        kind, shape, keys = ns["seen"][0]
        calls = [str(f) for f, _, _ in log.calls if "zeros" not in str(f)]
        rows[name] = (kind, shape, keys - ns["PLAIN_KEYS"], calls)
    assert rows["plain"] == ("Tensor", (2, 3), set(), ["aten.add_.Tensor", "aten.mul.Tensor"])
    assert rows["vmap"] == ("Tensor", (3,), {"FuncTorchBatched"}, ["aten.add_.Tensor", "aten.mul.Tensor"])
    assert rows["functionalize"] == ("Tensor", (2, 3), {"Functionalize"},
                                     ["aten.add.Tensor", "aten.mul.Tensor", "aten.copy_.default"])
    assert rows["fake"][:3] == ("FakeTensor", (2, 3), {"Python", "PythonTLSSnapshot"})
    x = torch.zeros(2, 3)  # the layers keep the meaning: the input is bumped, the result doubled
    out = ns["layered"]["functionalize"](x)
    assert torch.equal(x, torch.ones(2, 3)) and torch.equal(out, 2 * torch.ones(2, 3))
    assert ns["fake_t"].device.type == "cpu" and ns["fake_t"].untyped_storage().device.type == "meta"


def test_functionalized_graphs(lesson):
    ns = lesson.ns
    ns["seen"] = []
    targets = lambda gm: [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]  # noqa: E731
    assert targets(make_fx(ns["bump"])(torch.zeros(3))) == ["aten.add_.Tensor", "aten.mul.Tensor"]
    functional = make_fx(torch.func.functionalize(ns["bump"]))(torch.zeros(3))
    assert targets(functional) == ["aten.add.Tensor", "aten.mul.Tensor", "aten.copy_.default"]
    compiled = ns["captured"][0]
    assert targets(compiled) == ["aten.add.Tensor", "aten.mul.Tensor"]  # no mutation at all
    output = next(n for n in compiled.graph.nodes if n.op == "output")
    assert [a.name for a in output.args[0]] == ["add", "mul"]  # the input's new value comes out
    assert ns["u"].tolist() == [1.0] * 3 and ns["doubled"].tolist() == [2.0] * 3


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
    with pytest.raises(RuntimeError, match=r"view size is not compatible(?s:.*)Use \.reshape\(\.\.\.\) instead"):
        torch.compile(ns["flat_bad"], backend="aot_eager")(a)
    assert torch.equal(torch.compile(ns["flat_good"], backend="aot_eager")(a), (2 * a).reshape(-1))


def test_a_second_registration_replaces_the_op(lesson):
    """The prose: re-running the cell (custom_op with the same name) replaces the op and its
    fake. A name of the test's own, so the lesson's ops stay as they are."""
    define, a = lesson.ns["define_double"], lesson.ns["a"]
    for honest in (False, True):
        op = define("test_twice", honest=honest)
        fake = next(n for n in make_fx(op, tracing_mode="fake")(a).graph.nodes if n.op == "call_function")
        assert fake.meta["val"].stride() == ((1, a.shape[0]) if honest else (a.shape[1], 1))
    assert torch.equal(torch.ops.course02.test_twice(a), 2 * a)


def test_opcheck_catches_the_careless_fake(lesson):
    ns = lesson.ns
    with pytest.raises(Exception, match=r"test_faketensor failed.*Stride mismatch"):
        torch.library.opcheck(ns["double_bad"], (ns["a"],))
    result = torch.library.opcheck(ns["double_good"], (ns["a"].t(),))  # another layout too
    assert set(result.values()) == {"SUCCESS"}


# ----------------------------------------------------------------------------------------
# Exercise: written_inputs, against what really happens (version counters and values)


def make_inputs():
    """Three (4, 3) float tensors that share no memory; no value is 0 or 1."""
    g = torch.Generator().manual_seed(0)
    return [torch.rand(4, 3, generator=g) + 2 for _ in range(3)]  # (4, 3) each, values in [2, 3)


def really_written(fn):
    """Independent of schemas: the inputs whose version counter moved or whose values changed,
    run on ordinary tensors (a write that keeps every value still bumps the version)."""
    inputs = make_inputs()
    versions, values = [t._version for t in inputs], [t.clone() for t in inputs]
    fn(*inputs)
    return {k for k, t in enumerate(inputs)
            if t._version != versions[k] or not torch.equal(t, values[k])}


def set_row(a, b, c):
    a[1] = 5.0  # select, then fill_ on the view


def each_row(a, b, c):
    for row in b.unbind(0):  # (3,) views of b
        row.add_(1)


def sort_into(a, b, c):
    torch.sort(a, dim=-1, out=(c, torch.empty(4, 3, dtype=torch.long)))  # values into c


# name -> fn(a, b, c); the comment says which slip the case catches
CASES = {
    "in-place": lambda a, b, c: a.add_(b),  # b is only read
    "functional": lambda a, b, c: a.add(b) * c,  # nothing written
    "views-only": lambda a, b, c: (a.t(), b[0], c.view(-1)),  # Tensor(a) aliases, writes nothing
    "through-a-view": lambda a, b, c: b[1:].mul_(2),  # the written tensor is not the input
    "indexed-assignment": set_row,
    "same-values": lambda a, b, c: c.mul_(1),  # no value changes
    "out-argument": lambda a, b, c: torch.add(a, b, out=c),  # keyword-only, not `self`
    "two-outputs": sort_into,
    "tensor-list": lambda a, b, c: torch._foreach_add_([a, c], 1.0),  # Tensor(a!)[]
    "clone-then-write": lambda a, b, c: a.clone().add_(1),
    "result-then-write": lambda a, b, c: (a + b).relu_(),
    "reshape-is-a-view": lambda a, b, c: b.reshape(-1).add_(1),  # contiguous: a view (lesson 01)
    "reshape-copies": lambda a, b, c: b.t().reshape(-1).add_(1),  # transposed: a copy
    "contiguous-is-itself": lambda a, b, c: c.contiguous().zero_(),
    "list-of-views": each_row,
    "copy-into": lambda a, b, c: a[0].copy_(b[0]),  # a written, b read
    "through-data": lambda a, b, c: b.data.zero_(),  # same storage, no autograd
    "nothing": lambda a, b, c: None,
}


def in_inference_mode(fn):
    def run(*args):
        with torch.inference_mode():
            return fn(*args)
    return run


def inference_inputs():
    with torch.inference_mode():
        return [t.clone() for t in make_inputs()]  # inference tensors: no version counter


# writes that leave every value unchanged, on inference tensors: neither values nor
# version counters can tell; only the schemas can
INFERENCE_CASES = {
    "inference-same-values": lambda a, b, c: a[0].mul_(1),
    "inference-copy-itself": lambda a, b, c: c.copy_(c.clone()),
    "inference-out-argument": lambda a, b, c: torch.mul(b, 1, out=b),
}


@pytest.mark.exercise("written_inputs")
@pytest.mark.parametrize("fn", CASES.values(), ids=CASES.keys())
def test_written_inputs(exercise_module, fn):
    got = exercise_module.written_inputs(fn, *make_inputs())
    assert set(got) == really_written(fn)


@pytest.mark.exercise("written_inputs")
@pytest.mark.parametrize("fn", INFERENCE_CASES.values(), ids=INFERENCE_CASES.keys())
def test_written_inputs_on_inference_tensors(exercise_module, fn):
    got = exercise_module.written_inputs(in_inference_mode(fn), *inference_inputs())
    assert set(got) == really_written(fn)  # the same function on ordinary tensors


@pytest.mark.exercise("written_inputs")
def test_written_inputs_runs_fn_once(exercise_module):
    calls = []
    exercise_module.written_inputs(lambda a, b, c: calls.append(a.add_(1)), *make_inputs())
    assert len(calls) == 1


def test_exercise_cases_are_varied():
    """The expected answers cover empty, single, several and non-first positions, and the
    cases where values, or version counters, alone would be wrong."""
    answers = {name: really_written(fn) for name, fn in {**CASES, **INFERENCE_CASES}.items()}
    assert {frozenset(), frozenset({0}), frozenset({1}), frozenset({2}), frozenset({0, 2})} <= {
        frozenset(a) for a in answers.values()}
    for name in ("same-values", *INFERENCE_CASES):  # a write that keeps every value
        fn, inputs = {**CASES, **INFERENCE_CASES}[name], make_inputs()
        before = [t.clone() for t in inputs]
        fn(*inputs)
        assert answers[name] and all(torch.equal(t, u) for t, u in zip(inputs, before)), name
    inputs = make_inputs()
    CASES["through-data"](*inputs)  # a write the version counters miss: .data has its own
    assert answers["through-data"] and all(t._version == 0 for t in inputs)


# Plausible wrong answers; each must fail at least one exercise case.
def _by_values(fn, *inputs):
    before = [t.clone() for t in inputs]
    fn(*inputs)
    return {k for k, t in enumerate(inputs) if not torch.equal(t, before[k])}


def _by_versions(fn, *inputs):
    before = [t._version for t in inputs]
    fn(*inputs)
    return {k for k, t in enumerate(inputs) if t._version != before[k]}


class _Schemas(TorchDispatchMode):
    """Configurable: which arguments count as written, and how they are matched to inputs."""

    def __init__(self, inputs, rule):
        super().__init__()
        self.inputs, self.rule, self.hit = inputs, rule, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for k, arg in enumerate(func._schema.arguments):
            value = args[k] if k < len(args) else kwargs.get(arg.name)
            self.hit |= self.rule(func, k, arg, value, self.inputs)
        return func(*args, **kwargs)


def _same_storage(value, inputs, identity=False):
    vals = value if isinstance(value, (list, tuple)) else [value]
    match = (lambda v, t: v is t) if identity else (
        lambda v, t: v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr())
    return {i for v in vals if isinstance(v, torch.Tensor) for i, t in enumerate(inputs) if match(v, t)}


def _written(arg):
    return arg.alias_info is not None and arg.alias_info.is_write


WRONG_RULES = {
    "name ends with _": lambda f, k, a, v, ins: _same_storage(v, ins) if k == 0 and
    f._schema.name.endswith("_") else set(),
    "any alias is a write": lambda f, k, a, v, ins: _same_storage(v, ins) if a.alias_info else set(),
    "identity, not storage": lambda f, k, a, v, ins: _same_storage(v, ins, identity=True) if _written(a)
    else set(),
    "every tensor of a writing op": lambda f, k, a, v, ins: _same_storage(v, ins) if any(
        map(_written, f._schema.arguments)) else set(),
    "positional arguments only": lambda f, k, a, v, ins: _same_storage(v, ins) if _written(a) and
    not a.kwarg_only else set(),
    "single tensors only": lambda f, k, a, v, ins: _same_storage(v, ins) if _written(a) and
    isinstance(v, torch.Tensor) else set(),
}


def _with_rule(rule):
    def written_inputs(fn, *inputs):
        with _Schemas(inputs, rule) as mode:
            fn(*inputs)
        return mode.hit
    return written_inputs


def _fails_a_case(answer):
    for fn in CASES.values():
        if set(answer(fn, *make_inputs())) != really_written(fn):
            return True
    for fn in INFERENCE_CASES.values():
        try:
            if set(answer(in_inference_mode(fn), *inference_inputs())) != really_written(fn):
                return True
        except RuntimeError:  # e.g. reading _version of an inference tensor
            return True
    return False


@pytest.mark.parametrize("wrong", [_by_values, _by_versions, *map(_with_rule, WRONG_RULES.values())],
                         ids=["values", "versions", *WRONG_RULES])
def test_exercise_cases_catch_wrong_answers(wrong):
    assert _fails_a_case(wrong)


def test_exercise_solution_passes_every_case():
    """The same harness accepts a right answer (the right rule in the configurable mode)."""
    right = _with_rule(lambda f, k, a, v, ins: _same_storage(v, ins) if _written(a) else set())
    assert not _fails_a_case(right)

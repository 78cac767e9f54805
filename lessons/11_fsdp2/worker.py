"""The worker of lesson 11: DDP and FSDP2 (`fully_shard`) on 2 ranks.

    torchrun --standalone --nproc-per-node=2 lessons/11_fsdp2/worker.py main
    torchrun --standalone --nproc-per-node=2 lessons/11_fsdp2/worker.py pinned
    torchrun --standalone --nproc-per-node=4 lessons/11_fsdp2/worker.py int4
    ... worker.py main --backend nccl   # 2 CUDA devices; adds a `cuda_memory` section

- `main`: DDP as the baseline (one step, `no_sync` accumulation); FSDP2 on a tiny
  transformer-like model: placements and local sizes, one AdamW step vs one process, the
  hooks on `__call__`, `reshard_after_forward`, mixed precision, memory per rank,
  `set_requires_gradient_sync(False)` accumulation, CPU offload.
- `int4` (run it with `--nproc-per-node=4`): `reshard_after_forward=2` on 4 ranks, the
  local sizes and placements at rest, between forward and backward, and after backward.
  The lesson runs `int4_part` in its own process instead, as rank 0 of a fake process group
  of 4 (`init_process_group("fake", rank=0, world_size=4)`: no other process, collectives
  that move no data); the lesson's slow test checks that rank 0 of a real 4-rank launch
  prints the same lines. Nothing it prints may depend on a collective's values.
- `pinned`: `CPUOffloadPolicy()` (pin_memory=True by default) on a machine without an
  accelerator; the error is not caught, so the part fails: the launch ends with exit code 1,
  cleanly (the kit's teardown: no barrier after a failure, destroy_process_group, os._exit).

Output, process group and teardown come from the course's kit, lessons/multirank.py (lesson
09): `say` prints one line prefixed `rank N:`, `shared` a fact both ranks share (rank 0
only), `heading` starts a `== name ==` section; `serve` runs the part between `setup` and
`teardown`.
"""

import gc
import logging
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard,
                                    register_fsdp_forward_method)
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lessons/: the course's kit
from multirank import heading, say, serve, shared

V, D, T, B = 64, 32, 8, 4  # vocabulary, width, tokens per sequence, sequences per rank
NAMES = ("embed", "blocks.0", "blocks.1", "head")  # the modules we watch


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):  # (B, T, D)
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)  # each (B, T, D): one head
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)

    def encode(self, tokens):  # (B, T) -> (B, T, D)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens):  # (B, T) -> (B*T, V)
        # a 2-D input to the head: a 3-D one returns a view, and FSDP2 warns that an in-place
        # op on a view output would skip its pre-backward hook
        return self.head(self.encode(tokens).flatten(0, 1))


def make_model(dtype, device):
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    return Tiny().to(device=device, dtype=dtype)


def shard(model, **kw):
    """fully_shard bottom-up: each block is a unit, the root takes embed, norm and head."""
    for block in model.blocks:
        fully_shard(block, **kw)
    return fully_shard(model, **kw)


def batch(device, seed=1):
    """The global batch (2B sequences) and this rank's half of it."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (2 * B, T + 1), generator=gen).to(device)  # (2B, T+1)
    mine = tokens.chunk(dist.get_world_size())[dist.get_rank()]  # (B, T+1)
    return tokens, mine


def loss_fn(model, tokens):  # next-token prediction, mean over this batch
    logits = model(tokens[:, :-1])  # (b*T, V)
    return F.cross_entropy(logits, tokens[:, 1:].flatten())


def adamw_step(model, tokens):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # after sharding: it sees DTensors
    loss_fn(model, tokens).backward()
    opt.step()
    return opt


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def below(value, bound):
    """A rounding-level gap as text: its digits depend on the CPU (the vector instructions
    change the order of additions), its comparison with the bound does not."""
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def max_gap(model, ref):
    """Largest |difference| between a (possibly sharded) model's parameters and ref's."""
    pairs = zip(model.parameters(), ref.parameters())
    return max((full(p).detach().cpu() - q.detach().cpu()).abs().max().item() for p, q in pairs)


def accumulated_reference(tokens, device):
    """One process: 2 micro-batches, each the average of the 2 ranks' mean losses."""
    ref = make_model(torch.float64, device)
    for micro in tokens.view(2, 2, B // 2, T + 1).transpose(0, 1):  # micro m: (2 ranks, B/2, T+1)
        (sum(loss_fn(ref, m) for m in micro) / 2).backward()  # grads accumulate in .grad
    return ref


def grad_gap(model, ref):
    pairs = zip(model.parameters(), ref.parameters())
    return max((full(p.grad).cpu() - q.grad.cpu()).abs().max().item() for p, q in pairs)


# ----------------------------------------------------------------------------- DDP


def show_ddp(device):
    heading("ddp")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    adamw_step(ref, tokens)  # one process, the whole batch
    ddp = DDP(make_model(torch.float64, device))
    n = sum(p.numel() for p in ddp.parameters())
    say(f"holds all {n} parameters, grads all-reduced (averaged) in backward")
    adamw_step(ddp, mine)  # each rank: half the batch
    shared(f"one AdamW step vs one process on the whole batch: max gap {below(max_gap(ddp.module, ref), 1e-12)}")
    acc = DDP(make_model(torch.float64, device))
    with acc.no_sync():  # micro-batch 1: no all-reduce, grads only accumulate locally
        loss_fn(acc, mine[: B // 2]).backward()
    loss_fn(acc, mine[B // 2:]).backward()  # micro-batch 2: all-reduce the accumulated sum
    gap = grad_gap(acc.module, accumulated_reference(tokens, device))
    shared(f"no_sync accumulation vs manual accumulation: max grad gap {below(gap, 1e-15)}")
    return n


def unused_steps(kw, device, tokens):
    """Two backward passes of a DDP model with a layer its forward never calls."""
    model = make_model(torch.float32, device)
    model.spare = nn.Linear(D, D)  # registered, never called: no gradient ever
    ddp = DDP(model, **kw)
    try:
        for _ in range(2):
            loss_fn(ddp, tokens).backward()
    except RuntimeError as err:
        return f"RuntimeError: {str(err).split('. ')[0]}"
    return f"2 backward passes ran, spare.weight.grad {ddp.module.spare.weight.grad}"


def compressed_grads(device, tokens, hook=None):
    """DDP grads (fp32 model) and the bytes each bucket all-reduce sent, with an optional hook."""
    ddp, sent = DDP(make_model(torch.float32, device)), []
    if hook is not None:
        def counting(state, bucket):  # the hook casts the bucket, then all-reduces the copy
            sent.append(bucket.buffer().numel() * 2)  # fp16: 2 bytes per element
            return hook(state, bucket)
        ddp.register_comm_hook(None, counting)
    loss_fn(ddp, tokens).backward()
    grads = [p.grad for p in ddp.parameters()]
    return grads, sum(sent) or 4 * sum(g.numel() for g in grads)


def graph_nodes(out):
    """The autograd nodes reachable from out: the graph find_unused_parameters walks."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return len(seen)


def all_reduces(kw, device, tokens, steps=3):
    """All-reduces DDP issues in each of `steps` iterations (the profiler's c10d events);
    with a knob, the model has the unused layer. Also the reducer's unused-bytes record."""
    model = make_model(torch.float32, device)
    if kw:
        model.spare = nn.Linear(D, D)  # registered, never called
    ddp, counts = DDP(model, **kw), []
    for step in range(steps):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss_fn(ddp, tokens).backward()
        counts.append(sum(e.name == "c10d::allreduce_" for e in prof.events()))
        if step == 0:  # what each all-reduce carried: the backend's events record the tensors
            # sorted: gloo records these in its worker threads, so the list's order is not
            # reliably the order DDP issued them (static_graph's iteration 1 issues the map
            # first, find_unused_parameters after the gradients: seen with a recording group)
            sent = sorted(f"{e.input_dtypes[0]} {e.input_shapes[0]}" for e in prof.events()
                          if e.name in ("gloo:all_reduce", "nccl:all_reduce"))
    tensors = len(list(model.parameters()))
    return counts, ddp._get_ddp_logging_data()["unused_parameter_size"], sent, tensors


def show_ddp_knobs(device):
    heading("ddp knobs")
    _, mine = batch(device)
    for kw in ({}, {"find_unused_parameters": True}, {"static_graph": True}):
        shared(f"unused layer, DDP({', '.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}): "
               f"{unused_steps(kw, device, mine)}")
    for kw in ({}, {"find_unused_parameters": True}, {"static_graph": True}):
        counts, unused, sent, tensors = all_reduces(kw, device, mine)
        name = ", ".join(f"{k}={v}" for k, v in kw.items()) or "defaults, every parameter used"
        shared(f"all-reduces in iterations 1, 2, 3, DDP({name}): {counts}; "
               f"reducer's unused_parameter_size {unused} bytes")
        shared(f"  iteration 1 all-reduced: {', '.join(sent)}; the model has {tensors} parameter tensors")
    nodes = graph_nodes(make_model(torch.float32, device)(mine[:, :-1]))
    shared(f"find_unused_parameters=True: the graph walked from the logits after each forward has "
           f"{nodes} autograd nodes")
    exact, full = compressed_grads(device, mine)
    half, small = compressed_grads(device, mine, default_hooks.fp16_compress_hook)
    rel = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(half, exact))
    shared(f"fp16_compress_hook: bytes all-reduced {small} vs {full}; largest grad gap, "
           f"relative to the tensor's largest grad, above 1e-6: {rel > 1e-6}, below 1e-3: {rel < 1e-3}")


# ----------------------------------------------------------------------------- FSDP2


def local_numel(model):
    return sum(p.to_local().numel() for p in model.parameters())


def show_placements(mesh, device):
    heading("placements")
    model = shard(make_model(torch.float64, device), mesh=mesh)
    kinds = {(type(p).__name__, str(p.placements)) for p in model.parameters()}
    shared(f"parameter types and placements at rest: {sorted(kinds)}")
    w = model.head.weight
    say(f"head.weight global {list(w.shape)}, local {list(w.to_local().shape)}")
    total = sum(p.numel() for p in model.parameters())
    mine = local_numel(model)
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([mine], device=device))
    say(f"holds {mine} of {total} parameter elements ({mine / total:.3f})")
    shared(f"sum over ranks {sum(int(c) for c in counts)} = total {total}")


def show_step(mesh, device):
    heading("step")
    tokens, mine = batch(device)
    for dtype in (torch.float64, torch.float32):
        ref = make_model(dtype, device)
        adamw_step(ref, tokens)
        model = shard(make_model(dtype, device), mesh=mesh)
        opt = adamw_step(model, mine)
        state = opt.state[model.head.weight]
        bound = 1e-12 if dtype == torch.float64 else 1e-3
        shared(f"{str(dtype)[6:]}: one AdamW step vs one process: max gap {below(max_gap(model, ref), bound)}")
    shared(f"optimizer state is sharded too: exp_avg {type(state['exp_avg']).__name__} "
           f"{state['exp_avg'].placements}, local {list(state['exp_avg'].to_local().shape)}")


def root_grads(model, ref):
    """The root unit's own parameters (embed, norm, head): how many got a gradient, and the
    largest gap to the one-process gradient of the whole batch among those that did."""
    pairs = [(p, q) for (n, p), q in zip(model.named_parameters(), ref.parameters())
             if not n.startswith("blocks.")]
    gaps = [(full(p.grad) - q.grad).abs().max().item() for p, q in pairs if p.grad is not None]
    return f"{len(gaps)} of {len(pairs)}, max gap {below(max(gaps, default=float('nan')), 1e-15)}"


def by_columns(param):
    """shard_placement_fn: 2-D weights split along dim 1 (their input features); None: Shard(0)."""
    return Shard(1) if param.ndim == 2 else None


def show_placement_fn(mesh, device):
    heading("placement fn")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    adamw_step(ref, tokens)
    model = shard(make_model(torch.float64, device), mesh=mesh, shard_placement_fn=by_columns)
    for name in ("head.weight", "head.bias", "embed.weight"):
        p = model.get_parameter(name)
        say(f"{name}: global {list(p.shape)} {p.placements[0]}, local {list(p.to_local().shape)}")
    adamw_step(model, mine)
    shared(f"one AdamW step vs one process: max gap {below(max_gap(model, ref), 1e-12)}")


def show_hooks(mesh, device):
    heading("hooks")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    loss_fn(ref, tokens).backward()  # one process, the whole batch: the gradient to expect
    model = shard(make_model(torch.float64, device), mesh=mesh)
    try:
        model.forward(mine[:, :-1])
        shared("model.forward(x) on a fresh model: no error")
    except Exception as err:  # noqa: BLE001 - we print which error: the root's params are still DTensor shards
        shared(f"model.forward(x) on a fresh model: {type(err).__name__}: {str(err).splitlines()[0]}")
    loss_fn(model, mine).backward()
    shared(f"model(x) through __call__: root params with a grad {root_grads(model, ref)}")
    show_trap(mesh, device, mine, ref)
    show_fixes(mesh, device, mine, ref)


def show_trap(mesh, device, mine, ref):
    """unshard() then forward() on a model never called: the root's hooks never ran."""
    trap = shard(make_model(torch.float64, device), mesh=mesh)
    root = [p for n, p in trap.named_parameters() if not n.startswith("blocks.")]  # DTensors
    trap.unshard()  # gathers the root's params, but the root's pre-forward hook never ran
    F.cross_entropy(trap.forward(mine[:, :-1]), mine[:, 1:].flatten()).backward()
    shared(f"unshard() + forward() on a never-called model: root DTensor params with a grad "
           f"{sum(p.grad is not None for p in root)} of {len(root)}")
    pairs = zip(trap.named_parameters(), ref.parameters())  # the blocks' own hooks did run
    blocks = [(full(p.grad) - q.grad).abs().max().item() for (n, p), q in pairs if n.startswith("blocks.")]
    shared(f"trap: the blocks' grads vs one process: max gap {below(max(blocks), 1e-15)}")
    left = trap.head.weight  # still the gathered plain tensor: never resharded
    half = make_model(torch.float64, device)
    loss_fn(half, mine).backward()  # this rank's half batch only, one process
    say(f"trap: head.weight is now a {type(left).__name__}, its grad equal to this rank's own "
        f"half-batch grad: {torch.equal(left.grad, half.head.weight.grad)}")


def show_fixes(mesh, device, mine, ref):
    x = mine[:, :-1]  # (B, T)
    fixed = shard(make_model(torch.float64, device), mesh=mesh)
    loss_fn(fixed, mine).backward()  # one call through __call__ first: the root is set up
    fixed.zero_grad(set_to_none=True)
    fixed.unshard()
    F.cross_entropy(fixed.forward(x), mine[:, 1:].flatten()).backward()
    shared(f"unshard() + forward() after one model(x): root params with a grad {root_grads(fixed, ref)}")
    enc = shard(make_model(torch.float64, device), mesh=mesh)
    register_fsdp_forward_method(enc, "encode")  # encode() now runs the hooks too
    h = enc.encode(x)  # (B, T, D)
    same = torch.equal(h, make_model(torch.float64, device).encode(x))
    shared(f"register_fsdp_forward_method(model, 'encode'): encode(x) -> {type(h).__name__} "
           f"{list(h.shape)}, equal to one process: {same}")


def residency(model):
    """'full' or 'shard' for each watched module: FSDP2 swaps a gathered param in as a plain
    tensor and the DTensor shard back in when it reshards."""
    mods = dict(model.named_modules())
    return ["shard" if isinstance(next(mods[n].parameters()), DTensor) else "full" for n in NAMES]


def gathered_bytes(model):
    """Bytes of the parameters gathered right now (plain tensors); the shards stay as well."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not isinstance(p, DTensor))


def trace_step(model, tokens):
    """Residency of each watched module at each point of one forward + backward."""
    events, mods = [], dict(model.named_modules())
    shards = nbytes(model.parameters())  # at rest: every parameter is this rank's shard

    def snap(label):  # parameter bytes held now: all shards, plus each gathered unit
        events.append((label, residency(model), shards + gathered_bytes(model)))

    def during(name):
        return lambda mod, args: snap(f"fwd {name}")  # after FSDP's own pre-forward hook

    def after(name):
        def hook(mod, args, out):  # FSDP's pre-backward hook is registered first: it runs first
            out.register_hook(lambda g: snap(f"bwd {name}"))
        return hook

    handles = [mods[n].register_forward_pre_hook(during(n)) for n in NAMES]
    handles += [mods[n].register_forward_hook(after(n)) for n in NAMES]
    loss = loss_fn(model, tokens)
    snap("after fwd")
    loss.backward()
    snap("after bwd")
    for h in handles:
        h.remove()
    return events


def show_reshard(mesh, device):
    heading("reshard")
    _, mine = batch(device)
    for mode in (True, False, None):
        model = shard(make_model(torch.float32, device), mesh=mesh, reshard_after_forward=mode)
        events = trace_step(model, mine)
        _, state, held = events[NAMES.index("head") + 1]  # "after fwd": before backward()
        shared(f"reshard_after_forward={mode}: between forward and backward {dict(zip(NAMES, state))}")
        peak = max(b for _, _, b in events)  # parameter bytes: shards plus gathered units
        shared(f"reshard_after_forward={mode}: parameter bytes between forward and backward "
               f"{held}, peak {peak}")
        if mode is None:  # one line per moment: embed, blocks.0, blocks.1, head; param bytes
            for label, state, held in events:
                shared(f"trace {label:<12} | {' '.join(s[0] for s in state)} | {held:>6} bytes")


def show_reshard_int(mesh, device):
    """An int reshard_after_forward: the group size the parameters are resharded to."""
    heading("reshard int")
    _, mine = batch(device)
    logged = []
    log = logging.getLogger("torch.distributed.fsdp.fully_shard")  # its name in 2.13.0
    catch = logging.Handler()
    catch.emit = lambda record: logged.append(record.getMessage())
    log.addHandler(catch)
    for k in (1, 2, 3):
        try:
            model = shard(make_model(torch.float32, device), mesh=mesh, reshard_after_forward=k)
        except ValueError as err:
            shared(f"reshard_after_forward={k}: ValueError: {err}")
            continue
        events = trace_step(model, mine)
        _, state, held = events[NAMES.index("head") + 1]  # "after fwd": before backward()
        shared(f"reshard_after_forward={k}: between forward and backward {dict(zip(NAMES, state))}, "
               f"parameter bytes {held}")
    log.removeHandler(catch)
    shared(f"logged: {logged[0] if logged else None}")


def held(model):
    """This rank's parameter elements now, and head.weight's mesh, placements, local shape."""
    w = model.head.weight
    kind = f"mesh {tuple(w.device_mesh.mesh.shape)} {w.placements}, local {list(w.to_local().shape)}"
    total = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the global one
    return f"{sum(p.to_local().numel() for p in model.parameters())} of {total}", kind


def int4_part(device):
    """reshard_after_forward=2 on 4 ranks: resharded to groups of 2 between fwd and bwd.
    It prints shapes and counts only, never a value that went through a collective: the
    lesson runs it on a fake group (collectives that move no data) and shows these lines."""
    heading("reshard int 4")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    _, mine = batch(device)
    model = shard(make_model(torch.float32, device), mesh=mesh, reshard_after_forward=2)

    def report(label):
        n, kind = held(model)
        shared(f"reshard_after_forward=2 on {dist.get_world_size()} ranks, {label}: "
               f"holds {n} elements; head.weight {kind}")

    report("at rest")
    loss = loss_fn(model, mine)
    report("between forward and backward")
    loss.backward()
    report("after backward")
    return 0


def show_mixed(mesh, device):
    heading("mixed")
    _, mine = batch(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = shard(make_model(torch.float32, device), mesh=mesh, mp_policy=mp)
    seen = {}
    model.blocks[0].up.register_forward_hook(
        lambda m, args, out: seen.update(w=m.weight.dtype, x=args[0].dtype, out=out.dtype))
    logits = model(mine[:, :-1])
    shared(f"inside blocks.0.up: weight {seen['w']}, input {seen['x']}, output {seen['out']}")
    shared(f"logits {logits.dtype}")
    F.cross_entropy(logits.float(), mine[:, 1:].flatten()).backward()
    w = model.blocks[0].up.weight
    shared(f"at rest: blocks.0.up.weight {type(w).__name__} {w.dtype}, grad {w.grad.dtype}")


# ----------------------------------------------------------------------------- memory


def nbytes(tensors):
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors)


def accounting(model, opt, peak_params):
    params = nbytes(model.parameters())
    grads = nbytes(p.grad for p in model.parameters())
    state = nbytes(v for s in opt.state.values() for k, v in s.items() if k != "step")
    return params, grads, state, params + grads + state, peak_params + grads + state


REPEATS = 3  # a free made on a thread the profiler does not watch (gloo's) goes unseen


def allocator_bytes(builds, tokens):
    """{name: (live, peak)}: the CPU allocator's bytes over building the model and one AdamW
    step, from the profiler's memory events (allocations +, frees -) inside each range.
    Each build runs REPEATS times; an unseen free only adds, so the smallest is kept."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for name, build in builds.items():
            for i in range(REPEATS):
                gc.collect()  # the previous model's reference cycles freed outside the ranges
                with record_function(f"measure {name} {i}"):
                    model = build()
                    opt = adamw_step(model, tokens)
                del model, opt  # freed after the range: live bytes are what the step leaves
    events = list(prof.profiler.kineto_results.events())
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    found = {}
    for e in (e for e in events if e.name().startswith("measure ")):
        live = peak = 0
        for t, n in memory:
            if e.start_ns() <= t <= e.start_ns() + e.duration_ns():
                live += n
                peak = max(peak, live)
        name = e.name().split()[1]
        found[name] = min(found.get(name, (live, peak)), (live, peak))
    return found


def show_memory(mesh, device):
    heading("memory")
    _, mine = batch(device)
    ddp = DDP(make_model(torch.float32, device))
    opt = adamw_step(ddp, mine)
    p = nbytes(ddp.parameters())
    rows = {"DDP": accounting(ddp, opt, p)}
    model = shard(make_model(torch.float32, device), mesh=mesh)
    events = trace_step(model, mine)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.step()
    rows["FSDP2"] = accounting(model, opt, max(b for _, _, b in events))
    for name, row in rows.items():  # bytes: params, grads, AdamW, steady, peak
        say(f"{name} bytes: " + " ".join(str(v) for v in row))
    if device.type == "cpu":  # the profiler's memory events come from the CPU allocator here
        fp32 = lambda: make_model(torch.float32, device)  # noqa: E731
        measured = allocator_bytes({"DDP": lambda: DDP(fp32()),
                                    "DDP-view": lambda: DDP(fp32(), gradient_as_bucket_view=True),
                                    "FSDP2": lambda: shard(fp32(), mesh=mesh)}, mine)
        for name, (live, peak) in measured.items():
            say(f"{name} allocator: live after step {live}, peak {peak}")
        say(f"AdamW step counters: {sum(1 for _ in ddp.parameters())} x 4 bytes")
        log = ddp._get_ddp_logging_data()  # the reducer's own record (a private method)
        say(f"DDP buckets: sizes {log['bucket_sizes']} bytes, cap {log['bucket_cap_bytes']} bytes")
    units = {"root": sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks.")),
             "block": sum(p.numel() for p in model.blocks[0].parameters())}
    shared(f"unit sizes (elements): root {units['root']}, block {units['block']}")


def show_no_sync(mesh, device):
    heading("no_sync")
    tokens, mine = batch(device)
    ref = accumulated_reference(tokens, device)
    model = shard(make_model(torch.float64, device), mesh=mesh)
    model.set_requires_gradient_sync(False)  # micro-batch 1: keep unsharded grads, no reduce
    loss_fn(model, mine[: B // 2]).backward()
    model.set_requires_gradient_sync(True)  # micro-batch 2: reduce-scatter the accumulated sum
    loss_fn(model, mine[B // 2:]).backward()
    shared(f"set_requires_gradient_sync(False) accumulation vs manual: max grad gap "
           f"{below(grad_gap(model, ref), 1e-15)}")


def show_offload(mesh, device):
    heading("offload")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    adamw_step(ref, tokens)
    model = shard(make_model(torch.float64, device), mesh=mesh,
                  offload_policy=CPUOffloadPolicy(pin_memory=False))
    adamw_step(model, mine)
    w = model.head.weight.to_local()
    shared(f"CPUOffloadPolicy(pin_memory=False): shards on {w.device.type}, "
           f"step gap {below(max_gap(model, ref), 1e-12)}")
    try:
        shard(make_model(torch.float64, device), mesh=mesh, offload_policy=CPUOffloadPolicy())
        shared("CPUOffloadPolicy() (pin_memory=True): no error")
    except Exception as err:  # noqa: BLE001 - the error depends on the build of torch: the failing call does not
        where = traceback.extract_tb(err.__traceback__)[-1].line
        shared(f"CPUOffloadPolicy() (pin_memory=True): {type(err).__name__} raised by `{where}`")
        shared(f"an accelerator to pin memory for: {torch.accelerator.is_available()}")


def show_cuda_memory(mesh, device):
    """NCCL only: the peak CUDA memory of one FSDP2 step vs the steady-state formula."""
    heading("cuda_memory")
    _, mine = batch(device)
    model = shard(make_model(torch.float32, device), mesh=mesh)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    adamw_step(model, mine)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device) - base
    state = 4 * 3 * local_numel(model)  # fp32 grads and AdamW's 2 moments, sharded
    units = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks.1."))
    say(f"peak above the sharded params {peak} bytes; formula: grads + AdamW {state} bytes, "
        f"+ root and one block gathered {state + 4 * units} bytes")


def main_part(device):
    show_ddp(device)
    show_ddp_knobs(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    show_placements(mesh, device)
    show_step(mesh, device)
    show_placement_fn(mesh, device)
    show_hooks(mesh, device)
    show_reshard(mesh, device)
    show_reshard_int(mesh, device)
    show_mixed(mesh, device)
    show_memory(mesh, device)
    show_no_sync(mesh, device)
    if device.type == "cpu":
        show_offload(mesh, device)
    else:
        show_cuda_memory(mesh, device)
    return 0


def pinned_part(device):
    heading("pinned")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    shard(make_model(torch.float32, device), mesh=mesh, offload_policy=CPUOffloadPolicy())
    say("sharded with pinned CPU offload")
    return 0


if __name__ == "__main__":
    serve({"main": main_part, "pinned": pinned_part, "int4": int4_part})

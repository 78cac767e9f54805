# %% [markdown]
# # 14 · Capstone: train a small GPT with everything the course taught
#
# The course took PyTorch apart: tensors and views, the dispatcher, autograd, modules and
# data, precision, timing, attention, the compiler, collectives, FSDP2, checkpoints. This
# lesson puts the pieces back together: a small decoder-only transformer learns to reverse
# a string of digits, and we check it the way the course checks everything, by printing
# what happened.
#
# **What you will learn**
#
# - how a task (`data/reversal.csv`) becomes tokens, inputs and targets, with a held-out
#   split, and why exact match is a better measure than the loss;
# - a GPT in two short classes (`gpt.py`): pre-norm blocks, causal attention through SDPA,
#   tied embeddings;
# - the same run in five stages: (1) eager float32, (2) `torch.compile`, (3) bf16 autocast,
#   (4) two ranks with FSDP2, DCP checkpoints and a rank killed and restarted by torchrun,
#   (5) a profiler trace of one step and its MFU; what each stage changes and what it must
#   not change;
# - `train.py`, stage 4 as a script you can run unchanged with torchrun on GPUs (NCCL,
#   bf16) or CPUs (gloo), on one machine or several, resuming after a failure;
# - what a KV cache saves when the model writes its answer.
#
# **Prerequisites:** the whole course; most directly lessons 03a–03b (autograd), 05a–05b (bf16 and
# autocast), 06a–06b (profiler, FLOPs, MFU), 07a (SDPA), 08a–08b (`torch.compile`), 11a–11b (FSDP2)
# and 12a–12b (DCP, the restart drill). The 2-rank stage is launched with the course's
# multi-rank kit, `lessons/multirank.py` (lesson 09).
#
# **How to run:** `python lessons/14_capstone/capstone.py` or `make lesson N=14` from the
# repository root, or open `capstone.ipynb`. The model, the data and the training step live
# in `gpt.py` next to this file, which `train.py` imports too; read it first, it is short. `train.py` is written from this lesson's `#@worker train.py`
# cells (section 6); run it by hand from the repository root with
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2
# lessons/14_capstone/train.py CKPT` (and `--help`). The lesson takes 20 s to
# over a minute on 2 cores; the first `torch.compile` on a machine compiles
# C++ kernels, which can add a minute. Each printing cell is followed by an *Output* block:
# what it printed with the pinned PyTorch (2.13.0), placeholders where it depends on the
# machine. A plain run may also print, to stderr, `USDT: ... profiler_start` and
# `profiler_stop` and, on a CUDA build without a GPU, `No CUDA runtime is found`: harmless.

# %%
# ruff: noqa: E402 - the training script's imports (section 6, `#@worker train.py`) come mid-lesson
import atexit
import contextlib
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible runs; the ranks get one each too
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE.parent))  # lessons/: the multi-rank kit (lesson 09), the source map
sys.path.insert(0, str(HERE))  # this folder: gpt.py
import gpt
from multirank import kill_when, launch, section

STEPS, EVAL_EVERY = 150, 5  # stage 1: training steps; held-out evaluation every 5 steps
SHORT = 40  # stages 2 and 4 train the first 40 steps again (stage 3: BF16_STEPS)
BF16_STEPS = 30  # bf16 matmuls are slow on CPUs without bf16 instructions: keep it short
THRESHOLD = 0.95  # held-out exact match the run must reach, on any CPU


# %% [markdown]
# ## 1. The task: reverse six digits
#
# `data/reversal.csv` is made by `scripts/make_reversal.py` with a fixed seed (nothing is
# downloaded): each example is six random digits, `>`, and the same digits reversed. The
# model sees the first seven characters and must write the last six. 2,000 examples are for
# training and 500 are *held out*: the model never trains on them, so getting them right
# means it learned the rule rather than the examples.
#
# Tokens are characters: `0`-`9` are tokens 0-9 and `>` is token 10. A decoder-only model
# predicts every next character at once: the input is characters 1-12, the target
# characters 2-13. The first six targets are digits of the prompt, random and unpredictable,
# so they are set to `-100`, the `ignore_index` of `cross_entropy`: the loss counts the six
# answer characters only.
#
# **Predict.** How many of the 500 held-out strings also appear in the training set? What
# loss does a model that guesses uniformly among the 11 characters have?

# %%
data = gpt.load()
TRAIN, HELD = data["train"], data["heldout"]  # (2000, 13), (500, 13) int64
texts = {split: {gpt.decode(row) for row in rows} for split, rows in data.items()}
print(f"train {len(TRAIN)} examples, held-out {len(HELD)}, {TRAIN.shape[1]} characters each")
print(f"strings in both splits: {len(texts['train'] & texts['heldout'])}")
print(f"example: {gpt.decode(TRAIN[0])} -> tokens {TRAIN[0].tolist()}")
x0, y0 = gpt.split(TRAIN[:1])  # (1, 12) each
print(f"input  {gpt.decode(x0[0])}")
shown = "".join("." if t == gpt.IGNORE else gpt.VOCAB[t] for t in y0[0].tolist())
print(f"target {shown}  (. = {gpt.IGNORE}: ignored)")
print(f"uniform guess: loss ln 11 = {math.log(11):.3f}")

# %% [markdown]
# Output:
# ```text
# train 2000 examples, held-out 500, 13 characters each
# strings in both splits: 0
# example: 449480>084944 -> tokens [4, 4, 9, 4, 8, 0, 10, 0, 8, 4, 9, 4, 4]
# input  449480>08494
# target ......084944  (. = -100: ignored)
# uniform guess: loss ln 11 = 2.398
# ```
#
# The split is clean: no held-out string is in the training set. The target is the input
# shifted by one character, with the prompt's part masked: the input's 7th character (`>`)
# must predict the first answer digit, which is the *last* prompt digit, and so on. A
# model with no idea guesses each of the 11 characters with probability 1/11 and pays
# ln 11 per answer character.

# %% [markdown]
# ## 2. The model
#
# `gpt.GPT` is a decoder-only transformer of the kind lessons 07a and 11 used:
#
# - a token embedding (11 × 32) and a learned position embedding (12 × 32), added;
# - 2 **pre-norm** blocks (the arrangement of GPT-2 and its successors):
#   `x + attention(LayerNorm(x))`, then `x + MLP(LayerNorm(x))`; each block adds to the
#   residual stream `x` and never normalises `x` itself;
# - attention with 4 heads of 8 dimensions through `F.scaled_dot_product_attention(...,
#   is_causal=True)` (lesson 07a): position i attends to positions 0..i only;
# - a final LayerNorm and the output layer **tied** to the token embedding: logits are
#   `F.linear(x, tok.weight)`, the same 11 × 32 matrix that embeds the characters, so the
#   model has no separate output matrix.
#
# The embeddings start small (standard deviation 0.02), so the first logits are near zero.
#
# **Predict.** How many parameters? What is the first loss on the held-out set? If we change
# the answer characters of an input, do the logits at the positions before them change?

# %%
model = gpt.build(seed=0)
parts = {"tok": model.tok, "pos": model.pos, "blocks.0": model.blocks[0],
         "blocks.1": model.blocks[1], "norm": model.norm}
for name, part in parts.items():
    print(f"{name:9} {sum(p.numel() for p in part.parameters()):6,} parameters")
print(f"total     {sum(p.numel() for p in model.parameters()):6,} (the output layer is tok.weight: 0 more)")
x, y = gpt.split(HELD)  # (500, 12) each
with torch.no_grad():
    logits = model(x)  # (500, 12, 11)
    start_loss = gpt.loss_fn(model, HELD).item()
    print(f"logits {tuple(logits.shape)} {logits.dtype}; first held-out loss {start_loss:.2f}")
    changed = x.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 10  # other answer digits
    same = torch.equal(model(changed)[:, :7], logits[:, :7])
print(f"positions 0-6 unchanged when the answer's characters change: {same}")

# %% [markdown]
# Output:
# ```text
# tok          352 parameters
# pos          384 parameters
# blocks.0  12,704 parameters
# blocks.1  12,704 parameters
# norm          64 parameters
# total     26,208 (the output layer is tok.weight: 0 more)
# logits (500, 12, 11) torch.float32; first held-out loss 2.41
# positions 0-6 unchanged when the answer's characters change: True
# ```
#
# 26,208 parameters, nearly all in the two blocks' four linear layers (3,072 + 1,024 +
# 4,096 + 4,096 weights each, plus biases and LayerNorms). The first loss is close to the
# uniform guess's ln 11: small embeddings give near-zero logits. And the mask works: the
# logits of positions 0-6 (counting from 0: the six digits and `>`) are bitwise the same
# whatever follows them, because `is_causal=True` keeps every query from looking at later
# keys.

# %% [markdown]
# ## 3. Stage 1: eager, float32
#
# The training loop is the usual one: for each step, a batch, `zero_grad`, loss, `backward`,
# `AdamW.step` (learning rate 3e-3, no weight decay), all in `gpt.train_step`. The batch of
# step s is 64 rows drawn by `gpt.batch_rows(s)`, a generator seeded with s: the data order
# is a function of the step, which stage 4's restart will rely on. Every 5 steps we measure
# the held-out loss and the **exact match**: the share of held-out strings whose six answer
# digits are all the model's top choice.
#
# Exact match needs one forward pass, not six: given the true prefix, the model's top
# choice at every answer position is what greedy decoding would write, *if* all earlier
# choices were right; and if one is wrong the example fails either way. We check that
# claim against real greedy decoding below.
#
# **Predict.** The loss starts at ln 11 = 2.398. When does exact match leave zero: as soon
# as the loss falls, or later?


# %%
def train(model, opt, steps, every=0, bf16=False):
    """Steps 1..steps on gpt.batch_rows(step): per-step loss and seconds, and every `every`
    steps {step: (held-out loss, exact match)}."""
    log = {"loss": [], "seconds": [], "eval": {}}
    for step in range(1, steps + 1):
        seq = TRAIN[gpt.batch_rows(step, len(TRAIN))]  # (64, 13)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = gpt.train_step(model, opt, seq)
        log["seconds"].append(time.perf_counter() - start)
        log["loss"].append(loss.item())
        if every and step % every == 0:
            with torch.no_grad():
                log["eval"][step] = (gpt.loss_fn(model, HELD).item(), gpt.exact_match(model, HELD))
    return log


model = gpt.build(seed=0)
eager = train(model, gpt.optimizer(model), STEPS, every=EVAL_EVERY)
first_right = min(s for s, (_, acc) in eager["eval"].items() if acc > 0)
print(f"{STEPS} steps: median step {statistics.median(eager['seconds']) * 1e3:.1f} ms")
losses_at = eager["loss"]
print(f"train loss: step 1 {losses_at[0]:.3f}, step 20 {losses_at[19]:.2f}, step 40 {losses_at[39]:.1f}")
print(f"first held-out evaluation with an exact match above 0: step {first_right}")
for step in (first_right, 40, STEPS):
    held_loss, acc = eager["eval"][step]
    print(f"step {step:3d}: held-out loss {held_loss:.3f}, exact match {acc:.1%}")

# %% [markdown]
# Output:
# ```text
# 150 steps: median step «time» ms
# train loss: step 1 2.407, step 20 1.75, step 40 0.5
# first held-out evaluation with an exact match above 0: step 15
# step  15: held-out loss 1.952, exact match 0.2%
# step  40: held-out loss 0.471, exact match 99.8%
# step 150: held-out loss 0.009, exact match 100.0%
# ```
#
# The loss falls from the first steps, but exact match stays at zero for a while: six
# characters must *all* be right, and while each is right with probability p < 1, an
# example is right with roughly p⁶. Once the model has found which input position each
# answer position must copy, exact match climbs to the end within a few evaluations, and
# the loss keeps falling after that: the model grows more confident in answers it already
# gets right. The losses are printed to the digits that every CPU prints (the last digits
# depend on the CPU's vector instructions, and training amplifies them); the step time
# depends on the machine and its load.

# %% [markdown]
# **Predict.** Greedy decoding writes six characters one after another, each fed back as
# input. Does it get exactly the held-out strings right that the one-pass check counted?

# %%
greedy = gpt.generate(model, HELD[:, :gpt.DIGITS + 1])  # (500, 13): prompt + 6 greedy characters
right = (greedy == HELD).all(dim=1)  # (500,)
x, _ = gpt.split(HELD)
with torch.no_grad():
    one_pass = (model(x)[:, gpt.DIGITS:].argmax(-1) == HELD[:, gpt.DIGITS + 1:]).all(dim=1)
accuracy = right.float().mean().item()
print(f"greedy decoding: {int(right.sum())} of {len(HELD)} held-out strings right")
print(f"the same strings as the one-pass check: {torch.equal(right, one_pass)}")
print(f"held-out exact match at least {THRESHOLD:.0%}: {accuracy >= THRESHOLD}")

# %% [markdown]
# Output:
# ```text
# greedy decoding: 500 of 500 held-out strings right
# the same strings as the one-pass check: True
# held-out exact match at least 95%: True
# ```
#
# The one-pass check and greedy decoding agree string for string, as argued above. This
# is the result the run exists for: the model reverses strings it has never seen. The
# threshold is a bound that the run reaches on CPUs with and without vector instructions,
# with room to spare (100% here): a bound, not a digit string.

# %% [markdown]
# ## 4. Stage 2: `torch.compile`
#
# Lessons 08a–08b showed what the compiler does with a function; here it compiles the model.
# `torch.compile(model)` returns a wrapper that shares the model's parameters: the
# optimizer is made on them as before. The first call traces `forward` with Dynamo, and
# AOTAutograd derives the backward graph from it, so *both* directions run as code that
# Inductor generated; later calls reuse it while the guards hold (same shapes, same dtypes).
#
# **Predict.** Same initial weights, same batches, 40 steps: are the compiled run's losses
# equal to eager's bit for bit? Is a compiled step faster on this small model?

# %%
counters = torch._dynamo.utils.counters  # process-wide: count what this cell adds
graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
compiled_model = gpt.build(seed=0)
compiled = torch.compile(compiled_model)  # shares compiled_model's parameters
comp = train(compiled, gpt.optimizer(compiled_model), SHORT)
gap_compiled = max(abs(a - b) for a, b in zip(comp["loss"], eager["loss"]))
eager_ms = statistics.median(eager["seconds"][5:SHORT]) * 1e3
compiled_ms = statistics.median(comp["seconds"][5:]) * 1e3
print(f"first compiled step (trace, compile forward and backward): {comp['seconds'][0]:.1f} s")
graphs, breaks = counters["stats"]["unique_graphs"] - graphs, sum(counters["graph_break"].values()) - breaks
print(f"graphs compiled: {graphs}, graph breaks: {breaks}")
print(f"losses of steps 1-{SHORT}: bitwise equal to eager {comp['loss'] == eager['loss'][:SHORT]}, "
      f"max gap {gap_compiled:.1e}, below 1e-4: {gap_compiled < 1e-4}")
print(f"median step: eager {eager_ms:.1f} ms, compiled {compiled_ms:.1f} ms, "
      f"compiled/eager {compiled_ms / eager_ms:.2f}")
with profile(activities=[ProfilerActivity.CPU]) as comp_prof:  # one more compiled step
    gpt.train_step(compiled, gpt.optimizer(compiled_model), TRAIN[gpt.batch_rows(1, len(TRAIN))])
comp_ops = {e.key: e.count for e in comp_prof.key_averages() if e.key.startswith("aten::")}
still = sorted(k for k in comp_ops if "mm" in k or "scaled_dot" in k)  # matmuls and attention
fused = sum(n for k, n in comp_ops.items() if "layer_norm" in k or "gelu" in k)
print("the compiled step still calls these ATen kernels:")
for key in still:
    print(f"  {key}")
print(f"ATen layer_norm or gelu calls in the compiled step: {fused}")

# %% [markdown]
# Output:
# ```text
# first compiled step (trace, compile forward and backward): «time» s
# graphs compiled: 1, graph breaks: 0
# losses of steps 1-40: bitwise equal to eager False, max gap «number», below 1e-4: True
# median step: eager «time» ms, compiled «time» ms, compiled/eager «ratio»
# the compiled step still calls these ATen kernels:
#   aten::_scaled_dot_product_flash_attention_for_cpu
#   aten::_scaled_dot_product_flash_attention_for_cpu_backward
#   aten::addmm
#   aten::mm
# ATen layer_norm or gelu calls in the compiled step: 0
# ```
#
# One graph, no break: the model is plain tensor code. The compiled step still calls
# ATen's matmuls (`addmm`, `mm`) and fused attention from Inductor's code, while the
# LayerNorms and the GELU, forward and backward, are gone: Inductor wrote C++ loops of its
# own for them. Those loops round in another order than ATen's kernels, so the losses are
# *not* bitwise equal, and must not be expected to be. The gap is printed against a bound,
# 1e-4: far below the losses (2.4 down to 0.5 here), far above float32's rounding step near
# 1 (1.2e-7); a compiler bug would show as a gap of the order of the loss itself.
#
# The speed ratio is your machine's: a step is about 1,400 small ATen calls (stage 5
# counts them), compiling fuses the element-wise and normalisation ones (AdamW still runs
# op by op), which may or may not be faster on a given CPU. The first step paid for the
# compile: a cold Inductor cache compiles C++ files, a warm one loads them.

# %% [markdown]
# ## 5. Stage 3: bf16 autocast
#
# Lesson 05b's autocast runs selected ops in bfloat16 (8 significant bits instead of 24):
# on the CPU, linear layers, matmuls and SDPA; cross-entropy is on its float32 list. The
# parameters, their gradients and AdamW's moments stay float32 (the *master* copy):
# autocast casts a weight to bf16 each time an op uses it.
#
# **Predict.** Which of these are bf16 inside the autocast region: the token embedding's
# output, the first LayerNorm's output, the qkv projection, the block's output (the
# residual stream), the logits, the loss? Do the losses of 30 steps match float32's?


# %%
def dtypes_in_one_step(model):
    """The dtype of what each watched module returns, the loss, a gradient and AdamW's
    moment, for one bf16-autocast training step."""
    seen, opt = {}, gpt.optimizer(model)
    watch = {"tok": model.tok, "blocks.0.norm1": model.blocks[0].norm1, "blocks.0.qkv": model.blocks[0].qkv,
             "blocks.0 (residual stream)": model.blocks[0], "model (logits)": model}

    def note(name):
        def hook(module, args, out):  # returns None: the output is left as it is
            seen[name] = out.dtype
        return hook

    hooks = [m.register_forward_hook(note(name)) for name, m in watch.items()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = gpt.train_step(model, opt, TRAIN[gpt.batch_rows(1, len(TRAIN))])
    for hook in hooks:
        hook.remove()
    weight = model.blocks[0].qkv.weight
    return seen | {"loss": loss.dtype, "qkv weight": weight.dtype, "qkv weight's gradient": weight.grad.dtype,
                   "AdamW exp_avg": opt.state[weight]["exp_avg"].dtype}


for name, dtype in dtypes_in_one_step(gpt.build(seed=0)).items():
    print(f"{name:28} {dtype}")
bf16_model = gpt.build(seed=0)
low = train(bf16_model, gpt.optimizer(bf16_model), BF16_STEPS, bf16=True)
gap_bf16 = max(abs(a - b) for a, b in zip(low["loss"], eager["loss"]))
print(f"losses of steps 1-{BF16_STEPS}: bitwise equal to float32 {low['loss'] == losses_at[:BF16_STEPS]}, "
      f"max gap {gap_bf16:.3f}, below 0.05: {gap_bf16 < 0.05}")
bf16_ms = statistics.median(low["seconds"][5:]) * 1e3
print(f"median step: float32 {eager_ms:.1f} ms, bf16 autocast {bf16_ms:.1f} ms, "
      f"bf16/float32 {bf16_ms / eager_ms:.2f}")

# %% [markdown]
# Output:
# ```text
# tok                          torch.float32
# blocks.0.norm1               torch.float32
# blocks.0.qkv                 torch.bfloat16
# blocks.0 (residual stream)   torch.float32
# model (logits)               torch.bfloat16
# loss                         torch.float32
# qkv weight                   torch.float32
# qkv weight's gradient        torch.float32
# AdamW exp_avg                torch.float32
# losses of steps 1-30: bitwise equal to float32 False, max gap «number», below 0.05: True
# median step: float32 «time» ms, bf16 autocast «time» ms, bf16/float32 «ratio»
# ```
#
# What changes: the linear layers' outputs are bf16 (the qkv projection's and the logits
# above), so the queries, keys and values, the attention, the MLP's activations and the
# logits carry 8 significant bits, and the losses differ from float32's by a gap of the
# order of bf16's rounding (2⁻⁸ ≈ 0.004 relative), not of a bug: within the printed bound,
# and not zero.
# What does not: the embedding's output (an embedding is not on the autocast list), the
# residual stream (`x + bf16` is promoted to float32), the first LayerNorm's output (its
# input is that float32 stream), the loss (cross-entropy is on the float32 list), the
# weights, their gradients and the optimizer's state. On a CPU the speed of bf16 depends
# on whether it has bf16 instructions (AVX512-BF16, AMX): the ratio above is your CPU's.
# Keep bf16 matmuls small on a CPU until you know which kind it is.

# %% [markdown]
# ## 6. Stage 4: two ranks with FSDP2, checkpoints, a kill and a restart
#
# This stage trains the same `gpt.GPT` on 2 ranks with `train.py`, a script you can take
# to real hardware. The code cells below that start with `#@worker train.py` *are* that
# script, in order: here they only define things; torchrun runs `train.py`. It needs
# `torch`, `gpt.py` and `data/reversal.csv` (`gpt.DATA`). First the imports,
# the usage text (`--help` prints it) and the output helpers: whole lines prefixed
# `rank N:` (two ranks' prints interleave otherwise), `== name ==` headings.

# %%
#@worker train.py
import argparse
import datetime
import importlib.util
import os
import sys
from pathlib import Path
from time import sleep

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import gpt  # the capstone's model, data and step: the file next to this one

USAGE = """Train the capstone's GPT with FSDP2 and DCP checkpoints; resume after a failure.

On the CPU (gloo), as lesson 14 runs it:
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 \\
        --max-restarts=1 lessons/14_capstone/train.py CKPT
On one machine with N GPUs (NCCL, one GPU per rank from LOCAL_RANK, bf16 compute):
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=N \\
        --max-restarts=3 lessons/14_capstone/train.py CKPT
On 2 machines (run the same command on each; HOST is the first machine's address, CKPT a
folder both can read and write):
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=2 --nproc-per-node=N \\
        --max-restarts=3 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=capstone \\
        lessons/14_capstone/train.py CKPT
Under SLURM (one torchrun per node; the first node of the job hosts the rendezvous):
    srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=N bash -c \\
        'TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=$SLURM_NNODES \\
        --nproc-per-node=N --max-restarts=3 --rdzv-backend=c10d \\
        --rdzv-endpoint=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1):29500 \\
        --rdzv-id=$SLURM_JOB_ID lessons/14_capstone/train.py CKPT'
Run again after a failure, it resumes from the newest complete checkpoint in CKPT. Every
command sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: without it a group restarted by
--max-restarts may read the first attempt's addresses and fail (gloo: "connectFullMesh
failed ... Connection refused"; pytorch/pytorch#135712). The global --batch must be a
multiple of the ranks.
(unverified on a GPU, on several machines and under SLURM)"""
WAIT_S = 60.0  # how long a rank paused by --stop-at waits to be killed before it gives up


def say(text):
    print(f"rank {dist.get_rank()}: {text}", flush=True)  # one print per line


def shared(text):
    if dist.get_rank() == 0:  # a fact every rank shares: printed once
        say(text)


def heading(name):
    say(f"== {name} ==")


# %% [markdown]
# torchrun describes the group in each rank's environment (`RANK`, `WORLD_SIZE`,
# `MASTER_ADDR`, `LOCAL_RANK`), which `init_process_group` reads. With GPUs the backend is
# NCCL and each rank takes the GPU of its `LOCAL_RANK` (its rank on its machine); on the
# CPU it is gloo. The timeout is a minute (`--timeout-s`): gloo's default is 30 minutes
# (`default_pg_timeout`, read from `torch/distributed/constants.py`). Launched by the lesson, a
# rank also ends itself if the lesson's process dies, as the kit's ranks do (lesson 09).

# %%
#@worker train.py
def join(device_kind, timeout_s):
    """Join the group torchrun describes; returns this rank's device."""
    if os.environ.get("COURSE_LAUNCHER_PID"):  # started by the course's launch(): watch it
        from multirank import watch_launcher  # lessons/multirank.py (lesson 09)
        watch_launcher()
    timeout = datetime.timedelta(seconds=timeout_s)
    if device_kind == "cuda" or (device_kind == "auto" and torch.cuda.is_available()):
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return device


# %% [markdown]
# Each rank builds the model from the same seed and shards it: each block one FSDP2 unit,
# the root (embeddings, tied output, final norm) another (lesson 11a). On GPUs the units
# compute in bf16 over float32 weights (a `MixedPrecisionPolicy`, lesson 11b; unverified on
# a GPU): the blocks pass bf16 on, only the root casts its output (the logits) to float32 (a
# block's float32 output would crash the root's bf16 norm). On the CPU they stay float32,
# comparable with stage 1. AdamW holds the shards.

# %%
#@worker train.py
def shard_model(device, bf16, size):
    """The capstone's GPT, one FSDP2 unit per block, then the root; AdamW on the shards."""
    model = gpt.build(seed=0, **size).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    inner, root = MixedPrecisionPolicy(), MixedPrecisionPolicy()  # float32: no casts
    if bf16:  # blocks hand bf16 on to the next unit; only the root returns float32 logits
        inner = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        root = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                    output_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=inner)
    fully_shard(model, mesh=mesh, mp_policy=root)
    return model, gpt.optimizer(model)


# %% [markdown]
# Each rank takes its share of the same global batch of 64 rows; FSDP2 averages the
# gradients, so each update is the full batch's, up to rounding. The data order is an
# object with a state: here the step (`gpt.batch_rows`); exercise B writes a shuffled one.

# %%
#@worker train.py
class StepRows:
    """The lesson's data order: step s's rows are gpt.batch_rows(s); its state is the step."""

    def __init__(self, n, size, seed=0):
        self.n, self.size, self.seed, self.step = n, size, seed, 0

    def next(self):
        self.step += 1
        return gpt.batch_rows(self.step, self.n, self.size, self.seed)

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, sd):
        self.step = sd["step"]


def data_order(path):
    """StepRows, or (exercise B) the Shuffler class of the Python file at path."""
    if path is None:
        return StepRows
    spec = importlib.util.spec_from_file_location("answers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Shuffler


def step_once(model, opt, seq, device):
    """One step on this rank's rows of the global batch seq (B, 13); the global mean loss."""
    per = seq.shape[0] // dist.get_world_size()
    mine = seq[dist.get_rank() * per:(dist.get_rank() + 1) * per]  # (B / world, 13)
    loss = gpt.train_step(model, opt, mine.to(device))
    dist.all_reduce(loss)  # the sum of the ranks' mean losses
    return (loss / dist.get_world_size()).item()


# %% [markdown]
# The checkpoint (lesson 12a) holds all that decides the next step: the sharded model and
# AdamW state, the data order (DCP calls its `state_dict`) and the step. It counts once
# DCP's `.metadata`, written last, exists; `dcp.load` fills the template in place.

# %%
#@worker train.py
def checkpoint(model, opt, order, step):
    msd, osd = get_state_dict(model, opt)  # sharded DTensors: each rank saves its shards
    return {"model": msd, "optim": osd, "data": order, "step": step}


def resume(root, model, opt, order):
    """Load the newest complete checkpoint under root in place; its step (0: none)."""
    found = [None]  # rank 0 looks and tells the others: all ranks load the same checkpoint
    if dist.get_rank() == 0:
        found[0] = sorted(int(d.name[5:]) for d in root.glob("step_*") if (d / ".metadata").is_file())
    dist.broadcast_object_list(found, src=0)
    found = found[0]
    shared(f"complete checkpoints: {', '.join(f'step_{s}' for s in found) or 'none'}")
    if not found:
        return 0
    sd = checkpoint(model, opt, order, 0)  # the layout DCP reads into
    dcp.load(sd, checkpoint_id=root / f"step_{found[-1]}")
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return sd["step"]


# %% [markdown]
# The loop saves after every `--every` steps. `--stop-at K` is the drill: on the first
# attempt only, the ranks stop after step K, write their pid and wait to be killed.
# `--compare` then trains an uninterrupted run in the same processes and compares. `main`
# ends the group on every path with `destroy_process_group()`; after success only, a barrier
# first and `os._exit(0)` last, as `serve` does (lesson 09 says why).

# %%
#@worker train.py
def pause(root, step):
    """The drill: write this rank's pid, wait to be killed (first attempt only)."""
    flag, tmp = root / f"paused.rank{dist.get_rank()}", root / f"writing.rank{dist.get_rank()}"
    tmp.write_text(f"{os.getpid()}\n")
    tmp.rename(flag)  # atomic: the killer never reads half a pid
    say(f"paused after step {step}: waiting to be killed (kill -9 {os.getpid()})")
    sleep(WAIT_S)
    raise TimeoutError(f"paused for {WAIT_S:.0f} s and nobody killed this rank")


def fit(args, device, rows, stop_at=None, every=None, resume_from=True):
    """Train to args.steps from the newest checkpoint; {step: loss} and the full weights."""
    model, opt = shard_model(device, args.bf16, args.size)
    order = data_order(args.shuffler)(len(rows), args.batch)
    start = resume(args.ckpt, model, opt, order) if resume_from else 0
    if start:
        shared(f"resumed from step_{start}: next step {start + 1}")
    every, losses = args.every if every is None else every, {}
    for step in range(start + 1, args.steps + 1):
        losses[step] = step_once(model, opt, rows[order.next()], device)
        shared(f"step {step} loss {losses[step]!r}")
        if every and step % every == 0:
            dcp.save(checkpoint(model, opt, order, step), checkpoint_id=args.ckpt / f"step_{step}")
            shared(f"saved step_{step}")
        if step == stop_at:
            pause(args.ckpt, step)
    if not args.compare:
        return losses, None
    return losses, {n: p.full_tensor() for n, p in model.named_parameters()}  # gathered on every rank


def arguments():
    p = argparse.ArgumentParser(description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt", type=Path, help="the checkpoints' folder (shared by all machines)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10, help="save after every N-th step (0: never)")
    p.add_argument("--batch", type=int, default=gpt.BATCH, help="global batch, a multiple of the ranks")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto", help="auto: bf16 on GPUs")
    p.add_argument("--width", type=int, default=gpt.WIDTH)
    p.add_argument("--heads", type=int, default=gpt.HEADS)
    p.add_argument("--layers", type=int, default=gpt.LAYERS)
    p.add_argument("--timeout-s", type=float, default=60.0, help="the process group's timeout")
    p.add_argument("--stop-at", type=int, default=None, help="drill: first attempt pauses after this step")
    p.add_argument("--compare", action="store_true", help="then train uninterrupted and compare")
    p.add_argument("--shuffler", type=Path, default=None, help="a file with a Shuffler class (exercise B)")
    return p


def main():
    args = arguments().parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun
    if args.batch % world:  # each rank takes batch / world rows: refuse to drop any
        raise SystemExit(f"--batch {args.batch} is not a multiple of the {world} ranks")
    device = join(args.device, args.timeout_s)
    args.bf16 = args.precision == "bf16" or (args.precision == "auto" and device.type == "cuda")
    args.size = {"width": args.width, "heads": args.heads, "layers": args.layers}
    try:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun's restarts
        heading("attempt")
        say(f"TORCHELASTIC_RESTART_COUNT={attempt} pid {os.getpid()}")
        rows = gpt.load()["train"]  # (2000, 13) tokens
        heading("train")
        losses, params = fit(args, device, rows, stop_at=args.stop_at if attempt == 0 else None)
        if args.compare:
            heading("reference")  # the same ranks, from scratch, never stopped, no checkpoints
            ref_losses, ref_params = fit(args, device, rows, every=0, resume_from=False)
            shared(f"losses of this attempt's steps equal the uninterrupted run's: "
                   f"{all(losses[s] == ref_losses[s] for s in losses)}")
            same = all(torch.equal(params[n], ref_params[n]) for n in params)
            shared(f"final parameters bitwise equal to the uninterrupted run: {same}")
        dist.barrier()  # success only: no rank leaves while another still talks to it
    finally:
        dist.destroy_process_group()  # every path: end the group before the process ends
    # Success: leave without Python's shutdown. The mesh and the model still hold the group,
    # so its gloo threads outlive destroy_process_group(); one that frees the barrier's work
    # (a Python tensor with it) during shutdown aborts the rank: SIGABRT, "terminate called
    # without an active exception" (tests/workers/all_reduce.py has the evidence).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# %% [markdown]
# The drill: the lesson draws a step and a rank from a seed; a thread of the lesson (the
# kit's `kill_when`) waits for that rank's pid file and SIGKILLs it from outside, as a
# failing machine would. (The ranks stop so that the output is the same on every run; a
# real failure lands anywhere.) torchrun sees a rank die, stops the other, and with one
# restart allowed starts both again. The kit's `launch` (lesson 09) bounds the launch and
# leaves no process behind.
#
# **Predict.** Which checkpoint does the second attempt load, and which steps run twice?
# Are its final parameters bitwise equal to the uninterrupted 2-rank run's? Are the 2-rank
# losses equal to stage 1's single-process losses?

# %%
TRAIN_PY = HERE / "train.py"  # written from the #@worker train.py cells above
KILL_SEED, EVERY = 14, 10
gen = torch.Generator().manual_seed(KILL_SEED)
stop_at = int(torch.randint(EVERY + 1, SHORT, (1,), generator=gen))  # after a checkpoint, before the end
victim = int(torch.randint(0, 2, (1,), generator=gen))
TMP = Path(tempfile.mkdtemp(prefix="lesson14-"))  # the drill's checkpoints; removed at the end
atexit.register(shutil.rmtree, TMP, ignore_errors=True)  # ... and at exit, should a cell fail first


# the kit's kill_when: a thread of the parent SIGKILLs the victim once it wrote its pid
with kill_when(TMP / f"paused.rank{victim}") as killed:
    drill = launch(TRAIN_PY, [str(TMP), "--device", "cpu", "--steps", str(SHORT), "--every", str(EVERY),
                              "--stop-at", str(stop_at), "--compare"], restarts=1)
print(f"kill seed {KILL_SEED}: rank {victim} after step {stop_at} "
      f"(checkpoint every {EVERY} steps, {SHORT} steps)")
print(f"torchrun exit code {drill.code} after {drill.seconds:.1f} s; attempts {drill.attempts}")


def events(run, attempt):
    """What the ranks said in one attempt, without the per-step loss lines."""
    said = [*section(run, "attempt", attempt).values(), *section(run, "train", attempt).values()]
    for line in (line for lines in said for line in lines):
        if " loss " not in line:
            print(line)


events(drill, 0)
agent = drill.agent.splitlines()
dead = [m for m in agent if "failed (exitcode: -9)" in m]
print(f"the parent killed pid {killed[0]}: torchrun reports rank {victim} failed with exit code -9 "
      f"(SIGKILL): {any(f'local_rank: {victim} (pid: {killed[0]})' in m for m in dead)}")
other = section(drill, "attempt", 0)[1 - victim][0].rsplit(" ", 1)[1]  # the other rank's pid
print(f"torchrun then sent SIGTERM to the other rank: "
      f"{any(f'Sending process {other} closing signal SIGTERM' in m for m in agent)}")

# %% [markdown]
# Output:
# ```text
# kill seed 14: rank 0 after step 17 (checkpoint every 10 steps, 40 steps)
# torchrun exit code 0 after «time» s; attempts [0, 1]
# rank 0: TORCHELASTIC_RESTART_COUNT=0 pid «pid»
# rank 1: TORCHELASTIC_RESTART_COUNT=0 pid «pid»
# rank 0: complete checkpoints: none
# rank 0: saved step_10
# rank 0: paused after step 17: waiting to be killed (kill -9 «pid»)
# rank 1: paused after step 17: waiting to be killed (kill -9 «pid»)
# the parent killed pid «pid»: torchrun reports rank 0 failed with exit code -9 (SIGKILL): True
# torchrun then sent SIGTERM to the other rank: True
# ```
#
# The seed chose rank 0, the rank that coordinates DCP's saves, after step 17. The first
# attempt saved `step_10` on the way and stopped after step 17; the parent's SIGKILL is
# what torchrun's agent then reported (exit code -9: killed by signal 9). torchrun stopped
# the other rank itself (SIGTERM) and, with one restart allowed, started attempt 1.
#
# **Predict.** What does attempt 1 find, and do its numbers match?

# %%
def losses(run, name, attempt):
    """{step: loss} that rank 0 printed in one section of one attempt."""
    found = {}
    for line in section(run, name, attempt).get(0, []):
        if line.startswith("rank 0: step ") and " loss " in line:
            step, value = line[len("rank 0: step "):].split(" loss ")
            found[int(step)] = float(value)
    return found


events(drill, 1)
for line in section(drill, "reference", 1)[0][-2:]:
    print(line)
first, second, ref = losses(drill, "train", 0), losses(drill, "train", 1), losses(drill, "reference", 1)
replay = sorted(set(first) & set(second))
print(f"steps {replay[0]}-{replay[-1]} ran twice (the replay window); equal both times: "
      f"{all(first[s] == second[s] for s in replay)}")
gap_ranks = max(abs(ref[s] - eager["loss"][s - 1]) for s in ref)
print(f"2 ranks vs one process (stage 1), steps 1-{SHORT}: max loss gap {gap_ranks:.1e}, "
      f"below 1e-4: {gap_ranks < 1e-4}")

# %% [markdown]
# Output:
# ```text
# rank 0: TORCHELASTIC_RESTART_COUNT=1 pid «pid»
# rank 1: TORCHELASTIC_RESTART_COUNT=1 pid «pid»
# rank 0: complete checkpoints: step_10
# rank 0: resumed from step_10: next step 11
# rank 0: saved step_20
# rank 0: saved step_30
# rank 0: saved step_40
# rank 0: losses of this attempt's steps equal the uninterrupted run's: True
# rank 0: final parameters bitwise equal to the uninterrupted run: True
# steps 11-17 ran twice (the replay window); equal both times: True
# 2 ranks vs one process (stage 1), steps 1-40: max loss gap «number», below 1e-4: True
# ```
#
# Attempt 1 ran in new processes, found only `step_10` complete, resumed after it and
# computed steps 11-17 a second time (the *replay window*: up to 10 steps of work lost per
# failure is the price of checkpointing every 10 steps), with the same losses as the first
# time, bit for bit. The drill's result: the killed and restarted run ended with parameters
# **bitwise** equal to a 2-rank run that never stopped: the checkpoint holds every piece of
# state that decides the next step.
#
# Against stage 1, the 2-rank run is equal only to rounding: each rank computes its half
# batch's gradient, and FSDP2's reduce-scatter averages them, adding the same numbers in
# another order than one process does over 64 rows.

# %% [markdown]
# ## 7. Stage 5: a profiler trace of one step, and its MFU
#
# Lessons 06a–06b's tools, on this model. The profiler records one training step (after three
# warm-up steps) with `record_function` regions and writes a Chrome trace next to the
# lesson (open it in <https://ui.perfetto.dev>). `FlopCounterMode` counts the FLOPs of one
# step's forward and backward from the ops that ran. Lesson 06b's peak for this CPU is
# FLOPs per cycle (from the vector ISA PyTorch reports) × clock × threads, and MFU is the
# model's FLOPs per measured second over that peak.
#
# **Predict.** A step processes 64 × 12 = 768 tokens. Every weight of a matmul costs 2
# FLOPs per token forward and 4 backward (lesson 06b); there are 24,928 of them (4 linear
# layers per block and the tied output). What will the counter report? Where does
# attention's `q @ kᵀ` appear in the count?


# %%
def step_with_regions(model, opt, seq):
    with record_function("forward"):
        loss = gpt.loss_fn(model, seq)
    with record_function("backward"):
        opt.zero_grad(set_to_none=True)
        loss.backward()
    with record_function("optimizer"):
        opt.step()


probe = gpt.build(seed=0)
probe_opt = gpt.optimizer(probe)
batch = TRAIN[gpt.batch_rows(1, len(TRAIN))]  # (64, 13)
for _ in range(3):
    step_with_regions(probe, probe_opt, batch)  # warm-up: AdamW's state exists after the first
with profile(activities=[ProfilerActivity.CPU]) as prof:
    step_with_regions(probe, probe_opt, batch)
trace = HERE / "capstone_trace.json"
prof.export_chrome_trace(str(trace))
regions = {e["name"]: e["dur"] for e in json.loads(trace.read_text())["traceEvents"]
           if e.get("name") in ("forward", "backward", "optimizer") and e.get("ph") == "X"}
print(f"wrote {trace.name}: regions {sorted(regions)}")
total_us = sum(regions.values())
print("share of the step: " + ", ".join(f"{k} {100 * v / total_us:.0f}%" for k, v in regions.items()))
ran = sorted(e.key for e in prof.key_averages() if "scaled_dot_product" in e.key)
print(f"ATen ops called in the step: {sum(e.count for e in prof.key_averages() if e.key.startswith('aten::')):,}")
for op in ran:
    print(f"  attention ran as {op}")
with FlopCounterMode(display=False) as counter:
    gpt.loss_fn(probe, batch).backward()
step_flops = counter.get_total_flops()
by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
print(f"counted FLOPs of one step (forward + backward): {step_flops:,} {by_op}")
linears = [m for m in probe.modules() if isinstance(m, torch.nn.Linear)]
WEIGHTS = sum(m.weight.numel() for m in linears) + probe.tok.weight.numel()  # + the tied output
S, SEQS = gpt.LENGTH - 1, batch.shape[0]
TOKENS = SEQS * S
dense = 6 * WEIGHTS * TOKENS
print(f"6 x {WEIGHTS:,} weights x {TOKENS} tokens = {dense:,}: the count {dense == step_flops}")
attention = 12 * gpt.LAYERS * S**2 * gpt.WIDTH * SEQS
print(f"attention by formula: 12 x {gpt.LAYERS} layers x {S}^2 x {gpt.WIDTH} x {SEQS} sequences "
      f"= {attention:,} (+{attention / step_flops:.1%})")
registry = torch.utils.flop_counter.flop_registry  # op -> its FLOP formula
cpu_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
cuda_op = torch.ops.aten._scaled_dot_product_flash_attention
print(f"FlopCounterMode has a formula for the CPU's op: {cpu_op in registry}; for CUDA's flash op: {cuda_op in registry}")

# %% [markdown]
# Output:
# ```text
# wrote capstone_trace.json: regions ['backward', 'forward', 'optimizer']
# share of the step: forward «number»%, backward «number»%, optimizer «number»%
# ATen ops called in the step: 1,412
#   attention ran as aten::_scaled_dot_product_flash_attention_for_cpu
#   attention ran as aten::_scaled_dot_product_flash_attention_for_cpu_backward
#   attention ran as aten::scaled_dot_product_attention
# counted FLOPs of one step (forward + backward): 114,868,224 {'aten.addmm': 37748736, 'aten.mm': 77119488}
# 6 x 24,928 weights x 768 tokens = 114,868,224: the count True
# attention by formula: 12 x 2 layers x 12^2 x 32 x 64 sequences = 7,077,888 (+6.2%)
# FlopCounterMode has a formula for the CPU's op: False; for CUDA's flash op: True
# ```
#
# The counter found exactly 6 × weights × tokens: `addmm` for the biased linear layers'
# forward, `mm` for the tied output's forward and every backward matmul. Attention is not
# in it. On the CPU, SDPA runs as the fused op `_scaled_dot_product_flash_attention_for_cpu`
# (and its backward), and `FlopCounterMode` has no formula for that op (it has them for
# the CUDA kernels), so it counts it as 0 without a word. Attention's two matmuls, `q @ kᵀ`
# and the weighted sum of `v`, have no weights: 4·S²·d FLOPs per sequence and layer
# forward, twice that backward, 12·S²·d in all, with S = 12 positions and d = 32 (all
# heads together). We add them by formula (the formula counts the whole S × S square; the
# causal mask lets a kernel skip about half of it at large S). Check a FLOP counter
# against a formula before you trust an MFU.
#
# **Predict.** With these FLOPs and the measured step time, what MFU does a model of width
# 32 reach on one core: closer to 1% or to 50%?

# %%
FLOPS_PER_CYCLE = {"DEFAULT": (4, 2), "AVX2": (8, 4), "AVX512": (16, 4)}  # (fp32 lanes, FLOPs per lane)


def clock_ghz():
    """(GHz, where it was read): cpufreq's maximum, else /proc/cpuinfo, else 3.0 assumed
    (lesson 06b says why each, and why the peak is an estimate)."""
    cpufreq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz
    if cpufreq.is_file():
        return int(cpufreq.read_text()) / 1e6, str(cpufreq)
    cpuinfo = Path("/proc/cpuinfo")
    mhz = [float(line.split(":")[1]) for line in cpuinfo.read_text().splitlines()
           if line.startswith("cpu MHz")] if cpuinfo.is_file() else []
    return (max(mhz) / 1e3, str(cpuinfo)) if mhz else (3.0, "assumed")


capability = torch.backends.cpu.get_cpu_capability()
lanes, per_lane = FLOPS_PER_CYCLE.get(capability, FLOPS_PER_CYCLE["DEFAULT"])
ghz, source = clock_ghz()
peak = lanes * per_lane * ghz * 1e9 * torch.get_num_threads()  # FLOP/s
times = []
for _ in range(21):
    start = time.perf_counter()
    step_with_regions(probe, probe_opt, batch)
    times.append(time.perf_counter() - start)
step_s = statistics.median(times)
model_flops = step_flops + attention  # per step: counted matmuls + attention by formula
print(f"this CPU: {lanes * per_lane} FLOPs per cycle, {ghz:.2f} GHz ({source}), "
      f"{torch.get_num_threads()} thread: peak {peak / 1e9:.1f} GFLOP/s")
print(f"one step: {model_flops:,} FLOPs in {step_s * 1e3:.1f} ms (median of 21) "
      f"= {model_flops / step_s / 1e9:.2f} GFLOP/s, MFU {model_flops / step_s / peak:.1%}")
print(f"at the peak, these FLOPs would take {model_flops / peak * 1e3:.2f} ms")

# %% [markdown]
# Output:
# ```text
# this CPU: «number» FLOPs per cycle, «number» GHz («path»), 1 thread: peak «rate» GFLOP/s
# one step: 121,946,112 FLOPs in «time» ms (median of 21) = «rate» GFLOP/s, MFU «number»%
# at the peak, these FLOPs would take «time» ms
# ```
#
# The step takes longer than its FLOPs need at the peak, and MFU is that ratio. It does
# not say where the rest goes: the matmuls and attention may run below the peak at these
# small shapes; the ops the count leaves out (layer norms, GELU, the loss, AdamW's update)
# take time; and each of the about 1,400 ATen calls has a fixed cost (Python, dispatch,
# allocation) that tensors of width 32 do little to amortise. The trace (lesson 06a) shows
# which weighs most on your CPU. A wider
# model, longer sequences or a larger batch put more arithmetic behind each call, which
# is how MFU grows; on a GPU, bf16 and flash attention raise the peak and the rate alike
# (unverified on a GPU).

# %% [markdown]
# ## 8. The end: held-out accuracy and samples
#
# The model of stage 1 passed the held-out check above. Sampling is how a language model is
# used: draw each next character from the softmax of the logits (temperature 1), feed it
# back, repeat. `gpt.generate` does it with its own `torch.Generator`, so the samples are
# the same on every run.
#
# **Predict.** Sampling can pick a character that is not the most likely one. Guess: on 5
# held-out prompts (30 sampled characters), will it pick a wrong one?

# %%
sampler = torch.Generator().manual_seed(0)
samples = gpt.generate(model, HELD[:5, :gpt.DIGITS + 1], gen=sampler)  # (5, 13)
for row, truth in zip(samples, HELD[:5]):
    text = gpt.decode(row)
    verdict = "right" if torch.equal(row, truth) else "WRONG"
    print(f"{text[:gpt.DIGITS + 1]} -> {text[gpt.DIGITS + 1:]}  {verdict}")
x, _ = gpt.split(HELD)
with torch.no_grad():
    probs = F.softmax(model(x)[:, gpt.DIGITS:], dim=-1)  # (500, 6, 11)
right_p = probs.gather(-1, HELD[:, gpt.DIGITS + 1:, None])  # (500, 6, 1): the right character's
print(f"the right character's probability over the 500 x 6 held-out answers: lowest {right_p.min():.2f}, "
      f"median {right_p.median():.3f}")
all_right = right_p[:5].prod().item()  # each sampled character right, given right ones before it
print(f"chance that sampling writes all 30 characters of these 5 prompts right: {all_right:.2f}, "
      f"between 0.5 and 0.9: {0.5 < all_right < 0.9}")
print(f"held-out exact match of the final model: {accuracy:.1%}, "
      f"at least {THRESHOLD:.0%}: {accuracy >= THRESHOLD}")

# %% [markdown]
# Output:
# ```text
# 859803> -> 308958  right
# 306715> -> 517603  right
# 092151> -> 151290  right
# 459071> -> 170954  right
# 468883> -> 388864  right
# the right character's probability over the 500 x 6 held-out answers: lowest 0.94, median 0.991
# chance that sampling writes all 30 characters of these 5 prompts right: «number», between 0.5 and 0.9: True
# held-out exact match of the final model: 100.0%, at least 95%: True
# ```
#
# Five held-out prompts, five right reversals. The model puts most of the probability on
# the right character, so sampling picks it almost always, here all 30 times. The chance
# of that is the product of the right characters' probabilities along the 30 positions
# (while every character so far is right, the model sees the true prefix): far from a
# certainty, so another seed can well give a mistake. `temperature=3` divides the logits
# by 3 before the softmax and flattens the distribution: try it, and count the mistakes.

# %% [markdown]
# ## 9. A KV cache: decoding without recomputing the prefix
#
# Writing an answer takes six forward passes. Run plainly, each reads the whole sequence
# so far, although the earlier positions' keys and values never change (the causal mask,
# section 2). With a *KV cache*, the default of `gpt.generate`, every block keeps the keys
# and values it computed (`Block.forward`'s `cache`): the first pass runs the 7 prompt
# positions, each later one only the new character, whose query attends to the cached keys.
#
# **Predict.** Does the cache change any token, greedy or sampled? What share of the
# matmul FLOPs of decoding does it leave? (Count the positions each pass runs.)

# %%
prompts = HELD[:, :gpt.DIGITS + 1]  # (500, 7)
decoded, kv_flops = {}, {}
for cache in (False, True):
    with FlopCounterMode(display=False) as kv_counter:
        decoded[cache] = gpt.generate(model, prompts, cache=cache)  # greedy, (500, 13)
    kv_flops[cache] = kv_counter.get_total_flops()
print(f"greedy, 500 held-out prompts, with and without the cache: same tokens: "
      f"{torch.equal(decoded[True], decoded[False])}")
resampled = gpt.generate(model, HELD[:5, :gpt.DIGITS + 1], gen=torch.Generator().manual_seed(0), cache=False)
print(f"sampled, generator seed 0, without the cache: same tokens as above: {torch.equal(resampled, samples)}")
print(f"matmul FLOPs of greedy decoding: without the cache {kv_flops[False]:,}, with it {kv_flops[True]:,}")
print(f"with/without = {kv_flops[True] / kv_flops[False]:.3f}, the positions run: 12/57 = {12 / 57:.3f}: "
      f"{kv_flops[True] * 57 == kv_flops[False] * 12}")

# %% [markdown]
# Output:
# ```text
# greedy, 500 held-out prompts, with and without the cache: same tokens: True
# sampled, generator seed 0, without the cache: same tokens as above: True
# matmul FLOPs of greedy decoding: without the cache 1,420,896,000, with it 299,136,000
# with/without = 0.211, the positions run: 12/57 = 0.211: True
# ```
#
# The tokens are the same, greedy and sampled: the cache changes which positions are
# computed, not what any position sees. Without the cache the passes run 7, 8, ..., 12
# positions, 57 in all; with it 7, then 1 five times, 12 in all. The linear layers' FLOPs
# follow the positions that run through the model, 12 of 57, exactly. After the prompt,
# `Block.forward` takes one position at a time: `is_causal`'s mask would align several new
# queries with the first cached keys. Attention, not counted on the CPU (section 7),
# saves as well: one new query against the cached keys instead of the whole square again
# (`Block.forward`). The price is memory: every block keeps the keys and values of every
# position of every sequence, a (B, H, T, D/H) tensor each.

# %% [markdown]
# ## 10. All the stages in one figure
#
# **Predict.** Where do the compiled, bf16 and 2-rank curves lie relative to stage 1's?


# %%
def plot_stages(eager, comp, low, ranks):
    """Left: training loss per step for each stage and stage 1's held-out loss (log scale).
    Right: stage 1's held-out exact match over steps."""
    fig, (ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = range(1, len(eager["loss"]) + 1)
    ax.plot(steps, eager["loss"], color="0.6", linewidth=4, label="1: eager fp32 (train)")
    held = sorted(eager["eval"])
    ax.plot(held, [eager["eval"][s][0] for s in held], "k:", label="1: eager fp32 (held-out)")
    ax.plot(range(1, len(comp["loss"]) + 1), comp["loss"], "x", color="tab:blue", label="2: compiled")
    ax.plot(range(1, len(low["loss"]) + 1), low["loss"], "+", color="tab:orange", label="3: bf16 autocast")
    at = sorted(ranks)
    ax.plot(at, [ranks[s] for s in at], ".", color="tab:green", label="4: 2 ranks, FSDP2")
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="cross-entropy (answer characters)", title="Loss per stage")
    ax.legend(fontsize=8)
    acc_ax.plot(held, [100 * eager["eval"][s][1] for s in held], "o-", color="tab:purple", markersize=3)
    acc_ax.axhline(100 * THRESHOLD, color="tab:red", linestyle="--", label=f"threshold {THRESHOLD:.0%}")
    acc_ax.set(xlabel="step", ylabel="held-out exact match (%)", title="All 6 characters right",
               ylim=(-5, 105))
    acc_ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


fig = plot_stages(eager, comp, low, ref)
fig.savefig(HERE / "capstone_stages.png")

# %% [markdown]
# The compiled and 2-rank points sit on stage 1's curve (their gaps are rounding), the
# bf16 points next to it. The held-out loss follows the training loss: the model does not
# memorise 2,000 strings, it learns the rule, and exact match jumps from 0 to 100% in a
# few dozen steps once it has.

# %% [markdown]
# ## Summary
#
# - The data is the course's own (`scripts/make_reversal.py`, a fixed seed), with a clean
#   held-out split; the loss counts the answer characters only, and exact match (all six
#   right) is one forward pass, equal to greedy decoding string for string.
# - A 26,208-parameter GPT (pre-norm, causal SDPA, tied embeddings) learned to reverse
#   strings it never saw: held-out exact match above 95% after 150 steps, on every CPU.
# - `torch.compile`: one graph, no break, losses equal to eager to rounding (not bitwise:
#   fused kernels round differently), and a first step that pays for the compile.
# - bf16 autocast: linear layers' outputs and the logits in bf16, the loss, the residual
#   stream, the weights, gradients and AdamW's state in float32; losses within bf16's
#   rounding of float32's.
# - Two ranks with FSDP2, run by `train.py`, the script the lesson's `#@worker train.py`
#   cells make: losses equal to one process to rounding; a rank SIGKILLed at a seeded step,
#   torchrun restarted both, the ranks resumed from the newest complete DCP checkpoint and
#   ended bitwise equal to an uninterrupted 2-rank run. The same script runs on GPUs with
#   NCCL and bf16, and on several machines (unverified on a GPU).
# - `FlopCounterMode` gave 6 × matmul weights × tokens to the FLOP and missed attention on
#   the CPU (no formula for its fused op), so attention is added by formula; MFU is those
#   FLOPs per second over the CPU's peak, and it does not say where the rest goes.
# - A KV cache writes the same tokens with 12 of the 57 positions' matmul FLOPs.

# %% [markdown]
# ## Going further
#
# ### Where the rest of a step goes: a step on 1 row
#
# **Predict.** The same step on 1 row instead of 64 does 1/64 of the forward and backward
# arithmetic, and the same AdamW update. What share of the 64-row step's time does it take?

# %%
one, full = [], []
for _ in range(11):  # interleaved, so that a busy moment of the machine slows both alike
    for rows, log in ((batch, full), (batch[:1], one)):  # (64, 13), (1, 13)
        start = time.perf_counter()
        step_with_regions(probe, probe_opt, rows)
        log.append(time.perf_counter() - start)
share = statistics.median(one) / statistics.median(full)
print(f"a step on 1 row: {share:.0%} of the 64-row step's time (1/64 is {1 / 64:.1%}); "
      f"more than a tenth: {share > 0.1}")
with profile(activities=[ProfilerActivity.CPU]) as prof_one:
    step_with_regions(probe, probe_opt, batch[:1])
calls = sum(e.count for e in prof_one.key_averages() if e.key.startswith("aten::"))
print(f"ATen ops called in a 1-row step: {calls:,}")

# %% [markdown]
# Output:
# ```text
# a step on 1 row: «ratio»% of the 64-row step's time (1/64 is 1.6%); more than a tenth: True
# ATen ops called in a 1-row step: 1,404
# ```
#
# The share depends on the machine (hence `«ratio»`), but it is far above 1/64, and
# above a tenth: much of a step does not shrink with the rows. A 1-row step makes almost as many ATen calls as the 64-row one
# (compare with the count above), each with its fixed cost, and AdamW updates every
# parameter whatever the batch. A bigger batch does not make that
# part cheaper; it spreads it over more rows.

# %% [markdown]
# ### From two CPU ranks to GPUs and machines
#
# `train.py` takes its device from torchrun: with GPUs each rank uses NCCL and the GPU of
# its `LOCAL_RANK`, computes in bf16 and keeps float32 weights; without, gloo on the CPU.
# `python lessons/14_capstone/train.py --help` prints the commands: one machine with N
# GPUs, two machines joining torchrun's c10d rendezvous (`--nnodes=2 --rdzv-backend=c10d
# --rdzv-endpoint=HOST:29500`, the same command on each), and a SLURM job that starts one
# torchrun per node with `srun`. Three things change on a cluster: the checkpoint folder
# must be one that every machine reads and writes (DCP writes a file per rank and rank 0
# the `.metadata`), `--max-restarts` lets torchrun restart the whole group after a failure
# (the script resumes from the newest complete checkpoint), and `--batch` must be a
# multiple of the ranks (`main` refuses any other). The GPU, multi-node and SLURM paths are
# unverified on a GPU.
#
# ### Where PyTorch ends
#
# Everything this course showed is PyTorch's job: what a tensor is, which kernel runs,
# what autograd records, how precision, compilation, collectives, sharding and checkpoints
# behave. Much of what happens around a model in production lives in other layers built
# on it: *serving* a trained model to many users (batching requests, managing the KV
# cache, scheduling) is what inference engines such as vLLM and SGLang do; the
# orchestration of many processes and machines (rollouts for reinforcement learning, data
# pipelines, hyperparameter searches) is what systems such as Ray do; *tracking*
# experiments, metrics and artifacts is the job of tools such as MLflow or Weights &
# Biases. They call into PyTorch and rely on the guarantees this course checked; knowing
# where one layer ends is how you know where to look when something goes wrong.

# %% [markdown]
# ## References
#
# - [torch.distributed.fsdp.fully_shard](https://docs.pytorch.org/docs/2.13/distributed.fsdp.fully_shard.html): FSDP2's `fully_shard`, `MixedPrecisionPolicy` and the sharded module's methods (stage 4).
# - [torch.distributed.checkpoint](https://docs.pytorch.org/docs/2.13/distributed.checkpoint.html): DCP's `save`, `load`, `Stateful` and `get_state_dict` (stage 4).
# - [torch.distributed.elastic](https://docs.pytorch.org/docs/2.13/distributed.elastic.html): torchrun, its restarts and the c10d rendezvous for several machines.
# - [torch.compile](https://docs.pytorch.org/docs/2.13/generated/torch.compile.html): the compiler of stage 2.
# - [torch.autocast](https://docs.pytorch.org/docs/2.13/amp.html): autocast and its CPU op lists (stage 3).
# - [torch.utils.flop_counter.FlopCounterMode](https://docs.pytorch.org/docs/2.13/generated/torch.utils.flop_counter.FlopCounterMode.html): the FLOP counter of stage 5 and the KV cache.
# - [Attention Is All You Need](https://arxiv.org/abs/1706.03762): the transformer and its attention.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, the code behind the capstone's results is. Open each
# file in your editor at the line printed (the line numbers are those of your installed
# torch; they move between releases), or follow the link for C++ the wheel does not ship
# (at the installed release's tag). The stops follow the run:
# the loss that counts only the answer, what the compiled step leaves to ATen's kernels,
# how torchrun restarts the ranks and how DCP hands the data order back to them, and the
# FLOP counter's formula for attention.

# %%
from sourcemap import read_the_source  # lessons/ is on sys.path: first cell

read_the_source([
    ("pytorch:aten/src/ATen/native/LossNLL.cpp", "nll_loss_out_frame",
     "`F.cross_entropy` with class targets is `log_softmax` then `nll_loss` "
     "(`cross_entropy_loss_symint`, further down). In this CPU kernel a target equal to "
     "`ignore_index` (-100, the schema's default) is counted in `num_ignored` and skipped, and "
     "the mean divides by `batch_size - num_ignored`: the loss is a mean over the six answer "
     "characters only. With near-zero logits each of them costs about ln 11 = 2.398, and the "
     "first loss is 2.41 (sections 1 and 2)."),
    ("torch/_inductor/kernel/mm.py", "def tuned_addmm(",
     "Inductor's lowering of `addmm`, the biased linear layers: unless `max_autotune` or "
     "`max_autotune_gemm` is on, its only choice is `aten_addmm`, a call of ATen's own kernel from the generated code, "
     "which is why the compiled step still calls `aten::addmm` (section 4); `tuned_mm`, above, "
     "offers `aten_mm` the same way."),
    ("torch/_inductor/lowering.py", "aten._scaled_dot_product_flash_attention_for_cpu.default",
     "Inductor writes no code of its own for the CPU's fused attention: this `make_fallback` "
     "(and the next one, for the backward) registers a lowering that calls the ATen kernel, "
     "and `decomposition.py` removes the op's decomposition from Inductor's table (an op may "
     "not have both). So the compiled step still calls "
     "`aten::_scaled_dot_product_flash_attention_for_cpu` and its backward, while no ATen "
     "`layer_norm` or `gelu` call is left (section 4)."),
    ("torch/distributed/elastic/agent/server/api.py", "def _invoke_run(",
     "torchrun's agent loop: every `monitor_interval` it checks its workers "
     "(`_monitor_workers`, in `local_elastic_agent.py`), and the check itself stops the rest: "
     "the process context it polls (`_poll` in `elastic/multiprocessing/api.py`) sends SIGTERM "
     "to every worker still running as soon as one has failed, the SIGTERM the other rank "
     "received. With restarts left, `_restart_workers` (above) stops what remains, runs a new "
     "rendezvous and starts the group again as new processes, and one restart is used up; "
     "with none left it stops the workers and returns the failure. `local_elastic_agent.py` "
     "hands the count to the new ranks as `TORCHELASTIC_RESTART_COUNT` (section 6's attempt "
     "1)."),
    ("torch/distributed/checkpoint/state_dict_loader.py", "def load(",
     "It goes over the top-level keys: a value with `state_dict` and `load_state_dict` is "
     "`Stateful` (a `runtime_checkable` protocol in `stateful.py`: no base class needed), so "
     "its `state_dict()` is the template DCP reads into, handed back through "
     "`load_state_dict`; any other value is replaced by what was read. In `train.py`'s "
     "checkpoint the data order (`StepRows`, or exercise B's `Shuffler`) is the Stateful one "
     "and `step` a plain int: how attempt 1 knew to go on at step 11 (section 6)."),
    ("torch/utils/flop_counter.py", "def sdpa_flop(",
     "The decorator above it gives the formula to CUDA's fused SDPA ops (efficient, flash, "
     "cuDNN); none of the file's attention formulas is for the CPU's "
     "`_scaled_dot_product_flash_attention_for_cpu`. `__torch_dispatch__`, at the end of the "
     "file, decomposes an op without a formula when it has a `CompositeImplicitAutograd` "
     "kernel; the CPU's fused op has none (a CPU kernel only), so it runs as it is and "
     "`_count_flops` adds nothing for it, without a word: section 7's count had no attention. "
     "`sdpa_flop_count`, just above, is the formula the lesson adds by hand: two batched "
     "matmuls, 4·S²·d per sequence forward, the whole S × S square (`sdpa_flop`'s comment: "
     "causal attention is not accounted for)."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/LossNLL.cpp
#     search for `nll_loss_out_frame`: `F.cross_entropy` with class targets is
#     `log_softmax` then `nll_loss` (`cross_entropy_loss_symint`, further down). In this
#     CPU kernel a target equal to `ignore_index` (-100, the schema's default) is counted
#     in `num_ignored` and skipped, and the mean divides by `batch_size - num_ignored`:
#     the loss is a mean over the six answer characters only. With near-zero logits each
#     of them costs about ln 11 = 2.398, and the first loss is 2.41 (sections 1 and 2).
# torch/_inductor/kernel/mm.py:«line»  `def tuned_addmm(`
#     Inductor's lowering of `addmm`, the biased linear layers: unless `max_autotune` or
#     `max_autotune_gemm` is on, its only choice is `aten_addmm`, a call of ATen's own
#     kernel from the generated code, which is why the compiled step still calls
#     `aten::addmm` (section 4); `tuned_mm`, above, offers `aten_mm` the same way.
# torch/_inductor/lowering.py:«line»  `aten._scaled_dot_product_flash_attention_for_cpu.default`
#     Inductor writes no code of its own for the CPU's fused attention: this
#     `make_fallback` (and the next one, for the backward) registers a lowering that calls
#     the ATen kernel, and `decomposition.py` removes the op's decomposition from
#     Inductor's table (an op may not have both). So the compiled step still calls
#     `aten::_scaled_dot_product_flash_attention_for_cpu` and its backward, while no ATen
#     `layer_norm` or `gelu` call is left (section 4).
# torch/distributed/elastic/agent/server/api.py:«line»  `def _invoke_run(`
#     torchrun's agent loop: every `monitor_interval` it checks its workers
#     (`_monitor_workers`, in `local_elastic_agent.py`), and the check itself stops the
#     rest: the process context it polls (`_poll` in `elastic/multiprocessing/api.py`)
#     sends SIGTERM to every worker still running as soon as one has failed, the SIGTERM
#     the other rank received. With restarts left, `_restart_workers` (above) stops what
#     remains, runs a new rendezvous and starts the group again as new processes, and one
#     restart is used up; with none left it stops the workers and returns the failure.
#     `local_elastic_agent.py` hands the count to the new ranks as
#     `TORCHELASTIC_RESTART_COUNT` (section 6's attempt 1).
# torch/distributed/checkpoint/state_dict_loader.py:«line»  `def load(`
#     It goes over the top-level keys: a value with `state_dict` and `load_state_dict` is
#     `Stateful` (a `runtime_checkable` protocol in `stateful.py`: no base class needed),
#     so its `state_dict()` is the template DCP reads into, handed back through
#     `load_state_dict`; any other value is replaced by what was read. In `train.py`'s
#     checkpoint the data order (`StepRows`, or exercise B's `Shuffler`) is the Stateful
#     one and `step` a plain int: how attempt 1 knew to go on at step 11 (section 6).
# torch/utils/flop_counter.py:«line»  `def sdpa_flop(`
#     The decorator above it gives the formula to CUDA's fused SDPA ops (efficient, flash,
#     cuDNN); none of the file's attention formulas is for the CPU's
#     `_scaled_dot_product_flash_attention_for_cpu`. `__torch_dispatch__`, at the end of
#     the file, decomposes an op without a formula when it has a
#     `CompositeImplicitAutograd` kernel; the CPU's fused op has none (a CPU kernel only),
#     so it runs as it is and `_count_flops` adds nothing for it, without a word: section
#     7's count had no attention. `sdpa_flop_count`, just above, is the formula the lesson
#     adds by hand: two batched matmuls, 4·S²·d per sequence forward, the whole S × S
#     square (`sdpa_flop`'s comment: causal attention is not accounted for).
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each question before you open its answer. Every answer points to the section
# whose printed lines show it, here or in an earlier lesson (`*NN § ...*`).
#
# 1. **Place a failure in its layer.** Each symptom below can come from a run like this
#    one. Name the layer that produced it, from the tensor to the launcher, and the printed
#    check that tells you (`lessons/TROUBLESHOOTING.md` is the course's guide):
#    (a) in `gpt.Block.forward` you write attention out as its formula,
#    `y = (q @ k.transpose(-2, -1) / 8**0.5).softmax(-1) @ v` (B, H, S, D/H), and merge the
#    heads with `y.transpose(1, 2).view(b, s, d)`: it raises "view size is not compatible
#    with input tensor's size and stride"; (b) the compiled run's losses differ from
#    eager's in the 6th decimal;
#    (c) a training step's FLOP count has nothing for attention; (d) a rank dies with exit
#    code -9 and the job goes on in new processes; (e) after that restart the run finishes
#    without an error, but its final parameters differ from an uninterrupted run's.
#
#    <details><summary>Answer</summary>
#
#    (a) The tensor record: `y` is contiguous in (B, H, S, D/H), its transpose a view with
#    permuted strides, and no single stride can merge the heads' dimension with the head
#    size, so `view` refuses, exactly as lesson 01's `view without contiguous() failed` on
#    the same layout (*01 § The attention layout*). `reshape`, which `gpt.py` uses, copies
#    where `view` cannot
#    (*01 § `view` needs compatible strides; `reshape` and `contiguous()` may copy*).
#    (b) The compiler, and by itself no bug: the compiled step calls no ATen `layer_norm`
#    or `gelu` any more (Inductor computes them in code of its own, which rounds in another
#    order), the gap stays below 1e-4 while the losses go from 2.4 to 0.5, and one graph
#    with no break was compiled (*§ Stage 2: `torch.compile`*).
#    (c) The measuring tool, not the model: `FlopCounterMode` has no formula for the CPU's
#    fused attention op (`False`, and `True` for CUDA's flash op), so it counted 0 for it;
#    what it counted is exactly 6 × weights × tokens
#    (*§ Stage 5: a profiler trace of one step, and its MFU*). Lesson 06b counted attention's
#    12·S·S·d when it was written as plain matmuls (*06b § FLOPs: counting what a step does*).
#    (d) The launcher: torchrun's agent reported the rank failed with exit code -9
#    (SIGKILL), sent SIGTERM to the other rank and, with a restart left, started both again
#    as new processes (`TORCHELASTIC_RESTART_COUNT=1`)
#    (*§ Stage 4: two ranks with FSDP2, checkpoints, a kill and a restart*).
#    (e) The checkpoint's contents: something that decides the next step was not saved.
#    This drill saves the sharded weights, AdamW's state, the step and the data order (a
#    function of the step), and its final parameters are bitwise equal to the uninterrupted
#    run's. Lesson 12a's partial resumes fail silently: weights only retrained step 1's batch
#    and halved the LR two steps late; all but the RNG state took the right batch and LR
#    and still another loss (*12a § A checkpoint is the whole training state*).
#
#    </details>
#
# 2. **Bitwise or a bound?** The lesson compares runs five times: compiled with eager,
#    bf16 with float32, 2 ranks with one process, the restarted run with an uninterrupted
#    2-rank run, and the replayed steps 11-17 with their first run. Which comparisons can
#    demand bitwise equality, which only a bound, and why?
#
#    <details><summary>Answer</summary>
#
#    Bitwise: the restart. The restarted run's final parameters are bitwise those of the
#    uninterrupted 2-rank run, and steps 11-17 gave the same losses both times: the same
#    operations on the same bits, on the same number of ranks, in the same order
#    (*§ Stage 4: two ranks with FSDP2, checkpoints, a kill and a restart*); lesson 12a
#    restores one process the same way
#    (*12a § One process: save after one Adam step, restore, take the second step*). A
#    tolerance there would hide a missing piece of state. A bound everywhere else, each
#    because the arithmetic changed: the compiled step's own code adds in another order
#    (below 1e-4, `bitwise equal to eager False`; *§ Stage 2: `torch.compile`*), bf16 keeps
#    8 significant bits (below 0.05, not equal; *§ Stage 3: bf16 autocast*), and two ranks
#    average two half-batch gradients, the same numbers summed in another order (below
#    1e-4). Lesson 11a measured the same for FSDP2 against one process, below 1e-12 in
#    float64 (*11a § One AdamW step equals one process*).
#
#    </details>
#
# 3. **Predict.** Under `torch.autocast("cpu", dtype=torch.bfloat16)`, which of these come
#    out bf16 in one training step: the token embedding's output, the first LayerNorm's
#    output, the qkv projection, a block's output (the residual stream), the logits, the
#    loss, the qkv weight's gradient, AdamW's `exp_avg`? Lesson 05b showed a layer norm
#    returning bf16: why is the first LayerNorm's output float32 here?
#
#    <details><summary>Answer</summary>
#
#    Only the qkv projection and the logits, both linear layers (the logits are `F.linear`
#    with the tied embedding); everything else is float32 (*§ Stage 3: bf16 autocast*).
#    CPU autocast casts a linear layer's inputs down and cross-entropy's up, and has no rule
#    for `layer_norm` (`AutocastCPU False`): a layer norm computes in its input's dtype, bf16
#    in lesson 05b because its input was a bf16 linear output
#    (*05b § Autocast on the CPU: which ops run in bfloat16*). Here the first LayerNorm's
#    input is the residual stream, which starts as the float32 embedding output and stays
#    float32.
#
#    </details>
#
# 4. **Explain.** One step of this GPT is 121,946,112 FLOPs, and at the CPU's peak they would
#    take less than the step does (the MFU is below 1 on every machine). Which work do those
#    FLOPs count, what else takes time in the step, and why can MFU alone not tell you where
#    the rest of the time goes?
#
#    <details><summary>Answer</summary>
#
#    They count the matmuls' multiply-adds only: what `FlopCounterMode` found, all in `addmm`
#    and `mm` and exactly 6 × weights × tokens, plus attention's 12·S²·d added by formula
#    (*§ Stage 5: a profiler trace of one step, and its MFU*). Everything else also takes
#    time: the layer norms, the GELU, the loss and AdamW's update (a few FLOPs per element,
#    left out of the count), and the fixed cost of each of the step's 1,412 ATen calls, the
#    cost that put lesson 06b's 16² matmul in the overhead regime
#    (*06b § Three regimes: compute, memory, overhead*). MFU is one ratio for all of it: it
#    cannot say whether the matmuls and attention ran below the peak, the uncounted ops took
#    the time or the calls' fixed cost did. The profiler's table sorted by self time, or the trace this
#    stage wrote, says which on your CPU
#    (*06a § The profiler: named regions, a sorted table, a Chrome trace*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=14` checks your answers
# (`solutions.py` has one way).
#
# A. `lr_at(step, total, peak, warmup, floor=0.0)`: the learning rate of a linear warm-up
#    over the first `warmup` steps, then a cosine decay from `peak` to `floor` at step
#    `total`. Steps count from 1. Use it with `torch.optim.lr_scheduler.LambdaLR`, whose
#    function returns a *factor* of the optimizer's learning rate and counts from 0:
#    `LambdaLR(opt, lambda i: lr_at(i + 1, total, peak, warmup) / peak)` (the test checks
#    this recipe). Train stage 1 again with it: does the model still pass the threshold?
# B. `Shuffler`: the data order of a real loader, like `DataLoader(shuffle=True)`'s: a new
#    permutation of the rows every epoch, drawn from one generator. Write its `state_dict`
#    and `load_state_dict` so that
#    a checkpoint restores the order. The test runs this lesson's drill with your class
#    (`train.py DIR --shuffler exercises.py --compare`): the restarted run must end bitwise
#    equal to an uninterrupted one, with the resume in the second epoch.
#
# These change the lesson (its output is your reference):
#
# C. Kill rank 1 instead (another seed, or set `victim`), or choose a step right after a
#    checkpoint. What changes in the output, and what does not?
# D. Compile the whole training step (`torch.compile(gpt.train_step)`) rather than the
#    model: how many graphs, how long the first step, and are the losses still within
#    the tolerance?

# %%
shutil.rmtree(TMP, ignore_errors=True)  # the drill's checkpoints

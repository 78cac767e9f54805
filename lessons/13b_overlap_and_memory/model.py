"""The small decoder lesson 13's parts train on every strategy, shared by the lesson and its
worker (no distributed call here: the sharding is in the lesson's rank code).

An embedding (vocabulary 32, width 16), two pre-norm blocks (LayerNorm, causal attention with
4 heads of width 4, LayerNorm, an MLP 16 -> 64 -> 16, residuals), a final LayerNorm and a
linear head: 7,520 parameters. Each parameter comes from a generator of its own
(`init_weights`), so every model, sharded or not, starts from the same values."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

V, H, HEADS, S = 32, 16, 4, 8  # vocabulary, width, attention heads, tokens per sequence
BATCH = 8  # sequences in the global batch, split over the data-parallel ranks
BIG = 32  # sequences per rank where compute time or activation memory must show


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = HEADS  # tensor parallelism sets it to this rank's heads: HEADS // tp
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(H, H, bias=False) for _ in range(4))

    def forward(self, x):  # (B, S, H), the whole sequence
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, S, H // HEADS)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))  # (B, S, H)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):  # (B, S, H)
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm attention and MLP, each with a residual; `checkpointed` recomputes in backward."""

    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(H), Attention(), nn.LayerNorm(H), MLP()
        self.checkpointed, self.runs = False, 0

    def inner(self, x):  # (B, S, H) -> (B, S, H)
        self.runs += 1  # forward computations of this block, recomputations included
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward(self, x):
        if self.checkpointed:  # keep only x; run inner again in backward
            return checkpoint(self.inner, x, use_reentrant=False)
        return self.inner(x)


class Model(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.norm, self.head = nn.LayerNorm(H), nn.Linear(H, V)

    def forward(self, tokens):  # (B, S) -> (B, S, V) log-probabilities
        x = self.embed(tokens)  # (B, S, H)
        for block in self.blocks:
            x = block(x)
        return F.log_softmax(self.head(self.norm(x)), dim=-1)


def init_weights(model, seed=0, cut=None):
    """Every parameter from a generator of its own, one full parameter at a time; `cut(full, p)`
    (given for a sharded model) returns the piece of `full` that parameter p holds. The same
    values whether the model is sharded or not."""
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            gen = torch.Generator().manual_seed(seed + i)
            full = torch.randn(p.shape, generator=gen, dtype=p.dtype)  # one full parameter
            if p.dim() == 2:  # a matrix: scaled by its input width
                full = full / p.shape[1] ** 0.5
            else:  # a bias, or a norm's weight (around 1)
                full = 0.1 * full + ("norm" in name and name.endswith("weight"))
            p.copy_(cut(full.to(p.device), p) if cut else full)
    return model


def build(dtype=torch.float64, device="cpu", blocks=2):
    return init_weights(Model(blocks).to(device=device, dtype=dtype))


def batch(device, parts=1, part=0, size=BATCH):
    """The global batch (size, S + 1) and part `part` of `parts` equal pieces of it."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (size, S + 1), generator=gen).to(device)
    return tokens, tokens.chunk(parts)[part]


def loss_fn(model, tokens):  # next-token prediction, the mean over this batch
    return F.nll_loss(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())

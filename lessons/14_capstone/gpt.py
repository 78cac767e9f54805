"""Lesson 14's model, data and training step: one file that the lesson and its ranks import.

The lesson (`capstone.py`) explains each part and uses it in one process; `train.py` (the
training script, written from the lesson's cells) imports the same definitions, so its ranks
train exactly the same model. Nothing here makes a distributed call.

- the task: `data/reversal.csv` (made by `scripts/make_reversal.py`), `482913>319284`:
  6 digits, `>`, the digits reversed; tokens are characters;
- `GPT`: a decoder-only transformer, pre-norm blocks, causal attention through SDPA, learned
  positions, the output layer tied to the token embedding;
- `batch_rows`: which training rows step s uses, a function of (seed, s) alone;
- `loss_fn` (cross-entropy on the answer only), `exact_match` (all 6 digits right),
  `train_step`, `generate` (greedy or sampled with a seeded generator, with a KV cache).
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = Path(__file__).resolve().parents[2] / "data" / "reversal.csv"
VOCAB = "0123456789>"  # token i is the character VOCAB[i]
DIGITS = 6  # digits to reverse
LENGTH = 2 * DIGITS + 1  # characters per example: 6 digits, '>', 6 digits
WIDTH, HEADS, LAYERS = 32, 4, 2  # the model's size
BATCH, LR = 64, 3e-3  # sequences per step (global), AdamW's learning rate
IGNORE = -100  # cross_entropy's ignore_index: targets that are not the answer


def encode(text: str) -> list[int]:
    return [VOCAB.index(c) for c in text]


def decode(tokens) -> str:
    return "".join(VOCAB[int(t)] for t in tokens)


def load(path: Path = DATA) -> dict[str, torch.Tensor]:
    """{split: (N, 13) int64 tokens} from the CSV (columns example, split)."""
    rows: dict[str, list[list[int]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row["split"], []).append(encode(row["example"]))
    return {split: torch.tensor(r) for split, r in rows.items()}


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x, cache=None):  # (B, S, D)
        """cache: None, or this block's dict of the keys and values of earlier positions,
        which the call extends with its own (decoding one position at a time)."""
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads)  # (B, S, 3, H, D/H)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, S, D/H)
        if cache is not None:
            if cache:  # positions before these: their keys and values, computed once
                if s > 1:  # is_causal's mask is top-left: it would hide the newest cached keys
                    raise ValueError("with a filled cache, feed one position at a time")
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)  # (B, H, T, D/H)
            cache["k"], cache["v"] = k, v
        # causal among the new positions; a single new query may see every cached key
        att = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1)  # (B, H, S, D/H)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))  # (B, S, D)
        return x + self.down(F.gelu(self.up(self.norm2(x))))  # (B, S, D)


class GPT(nn.Module):
    """Token + position embeddings, LAYERS blocks, a final norm, logits through the token
    embedding's own weight (tied: no separate output matrix)."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS, layers: int = LAYERS,
                 context: int = LENGTH - 1, vocab: int = len(VOCAB)):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        for table in (self.tok, self.pos):  # small: logits start near 0 (loss ~ ln 11)
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, tokens, cache=None):  # (B, S) int64 -> (B, S, V) logits
        """cache: None (the usual call), or one dict per block (`new_cache`): the call
        continues the sequence whose keys and values the cache holds."""
        start = cache[0]["k"].shape[2] if cache and cache[0] else 0  # positions already cached
        x = self.tok(tokens) + self.pos.weight[start:start + tokens.shape[1]]  # (B, S, D)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i])
        return F.linear(self.norm(x), self.tok.weight)  # (B, S, V): tied to the embedding

    def new_cache(self) -> list[dict]:
        """An empty KV cache: one dict per block, filled by forward(tokens, cache)."""
        return [{} for _ in self.blocks]


def build(seed: int = 0, **size) -> GPT:
    torch.manual_seed(seed)  # the same initial weights in every process that builds it
    return GPT(**size)


def optimizer(model: nn.Module, lr: float = LR) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)


def batch_rows(step: int, n: int, size: int = BATCH, seed: int = 0) -> torch.Tensor:
    """The rows of the training set that step `step` (1, 2, ...) uses: (size,) indices drawn
    from a generator seeded by (seed, step), so a resumed run needs no data state."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n, (size,), generator=gen)


def split(seq: torch.Tensor):
    """Inputs and targets of next-character prediction; only the answer is a target."""
    x, y = seq[:, :-1], seq[:, 1:].clone()  # (B, 12) each
    y[:, :DIGITS] = IGNORE  # the prompt's digits are random: nothing to learn there
    return x, y


def loss_fn(model: nn.Module, seq: torch.Tensor) -> torch.Tensor:
    x, y = split(seq)
    logits = model(x)  # (B, 12, V)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)  # fp32 under autocast


def train_step(model: nn.Module, opt: torch.optim.Optimizer, seq: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model, seq)
    loss.backward()
    opt.step()
    return loss.detach()


@torch.no_grad()
def exact_match(model: nn.Module, seq: torch.Tensor) -> float:
    """Share of examples whose 6 answer digits are all the model's top choice, given the
    true prefix: one forward pass (equal to greedy decoding, see the lesson)."""
    x, _ = split(seq)
    guess = model(x)[:, DIGITS:].argmax(-1)  # (B, 6): predictions of characters 7..12
    return (guess == seq[:, DIGITS + 1:]).all(dim=1).float().mean().item()


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, gen: torch.Generator | None = None,
             temperature: float = 1.0, cache: bool = True) -> torch.Tensor:
    """Append DIGITS characters to prompt (B, 7): sampled with `gen` at `temperature`,
    or the most likely one (greedy) when gen is None. cache=True runs the prompt once and
    then only each new character, keeping every block's keys and values (a KV cache);
    cache=False runs the whole sequence so far for every new character."""
    kv = model.new_cache() if cache else None
    out, feed = prompt, prompt  # feed: what the next forward pass reads
    for _ in range(DIGITS):
        logits = model(feed, kv)[:, -1].float() if cache else model(out)[:, -1].float()  # (B, V)
        if gen is None:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            nxt = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1, generator=gen)
        out, feed = torch.cat([out, nxt], dim=1), nxt  # (B, S + 1), (B, 1)
    return out

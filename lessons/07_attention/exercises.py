"""Lesson 07 exercises: attention's contracts, written by hand.

Replace each `raise NotImplementedError` with your code, then run `make exercises N=07`: the
tests compare your functions with PyTorch's SDPA (math backend, float64) and with brute-force
masks, on cases chosen to catch the usual slips. Use `torch` only; shapes follow the lesson:
(..., H, L, D) for queries, (..., H, S, D) for keys, (..., H, S, Dv) for values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def sdpa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """What `F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=..., enable_gqa=...)`
    returns (dropout 0, default scale), written with matmul and softmax.

    - q: (B, Hq, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv). Result: (B, Hq, L, Dv).
    - The scale is 1/sqrt(D), D being the query/key size (not Dv).
    - `attn_mask` broadcasts to (B, Hq, L, S). Boolean: True = take part. Floating point:
      added to the scores (0 keeps, -inf removes, other values bias).
    - `is_causal=True` (never together with `attn_mask`): query i keeps keys j <= i, indices
      counted from 0 on both sides (upper-left alignment, also when L != S).
    - `enable_gqa=True`: Hkv divides Hq and query head h uses KV head h // (Hq // Hkv).
    - A query row with no key left (every score -inf) gives a row of zeros, as SDPA does in
      PyTorch 2.13.0, not NaN.

    >>> q = k = torch.zeros(1, 1, 2, 4); v = torch.tensor([[[[10., 0.], [0., 10.]]]])
    >>> sdpa_reference(q, k, v, attn_mask=torch.tensor([[True, False], [True, False]]))
    tensor([[[[10.,  0.],
              [10.,  0.]]]])
    """
    raise NotImplementedError("sdpa_reference")


def document_causal_mask(doc_lens: Sequence[int]) -> Callable:
    """A FlexAttention `mask_mod` for packed documents, causal inside each document.

    `doc_lens` are the lengths of the documents packed one after the other (all >= 1); the
    packed sequence has N = sum(doc_lens) tokens. The returned function
    `mask_mod(b, h, q_idx, kv_idx)` receives integer tensors and returns a boolean tensor:
    True exactly when the key is in the same document as the query and not after it
    (kv_idx <= q_idx). It must work with `create_mask` / `create_block_mask`, which call it
    on tensors through `torch.vmap`: use tensor indexing and `&`, no Python `if` on tensors.

    >>> from torch.nn.attention.flex_attention import create_mask
    >>> create_mask(document_causal_mask([2, 1]), None, None, 3, 3, device="cpu")[0, 0].int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [0, 0, 1]], dtype=torch.int32)
    """
    raise NotImplementedError("document_causal_mask")


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v without ever holding more than `block` keys' scores.

    q: (..., L, D); k: (..., S, D); v: (..., S, Dv); result (..., L, Dv); no mask. Walk the
    keys in chunks of `block` (the last chunk may be shorter) and keep, per query row, the
    running maximum score m, the running sum of exp(score - m) and the running output. When
    a chunk raises m, rescale what you have accumulated by exp(m_old - m_new) before adding
    the chunk. Divide by the sum once, at the end. No intermediate tensor may have a size
    of L × S per (batch, head): the tests watch every op you run.

    Subtracting the running maximum is not optional: the tests use scores large enough
    (about 2000) that exp() of a raw score overflows, even in float64.
    """
    raise NotImplementedError("tiled_attention")

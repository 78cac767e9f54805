"""Lesson 07a exercises: SDPA's contract, written by hand.

Replace the `raise NotImplementedError` with your code, then run `make exercises N=07a`: the
tests compare your function with PyTorch's SDPA (math backend, float64) on cases chosen to
catch the usual slips. Use `torch` only; shapes follow the lesson: (..., H, L, D) for
queries, (..., H, S, D) for keys, (..., H, S, Dv) for values.
"""

from __future__ import annotations

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
    returns (dropout 0, default scale), written with matmul and softmax: calling SDPA itself
    (with any backend) fails the tests, which watch the ops you run.

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

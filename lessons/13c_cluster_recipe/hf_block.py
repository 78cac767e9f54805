"""The block of lesson 13c's exercise: a Llama block with Hugging Face's module names (no
distributed call here: the plan is the exercise)."""

import torch.nn as nn
import torch.nn.functional as F

D, HEADS = 32, 4  # width and attention heads of HFBlock


class HFAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_heads = HEADS  # the tests set it to HEADS // tp after applying your plan
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D, bias=False) for _ in range(4))

    def forward(self, x):  # (B, S, D)
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class HFMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, 4 * D, bias=False), nn.Linear(D, 4 * D, bias=False)
        self.down_proj = nn.Linear(4 * D, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HFBlock(nn.Module):
    """A Llama block with Hugging Face's module names."""

    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attn = nn.RMSNorm(D), HFAttention()
        self.post_attention_layernorm, self.mlp = nn.RMSNorm(D), HFMLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

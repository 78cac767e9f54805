"""Lesson 09 solutions: collectives and DTensor redistributions, simulated in one process.

`parts` is a list with one 1-D tensor per rank (parts[r] is what rank r holds)."""

import torch


def all_reduce(parts):
    """Every rank ends with the elementwise sum of all ranks' tensors."""
    total = torch.stack(parts).sum(0)
    return [total.clone() for _ in parts]


def reduce_scatter(parts):
    """Sum, then rank r keeps the r-th of len(parts) equal chunks (numel divides evenly)."""
    total = torch.stack(parts).sum(0)
    return [c.clone() for c in total.chunk(len(parts))]


def shard(t, world):
    """DTensor's Shard(0) pieces of t: chunks of ceil(n / world), the last ones short or empty."""
    size = -(-t.numel() // world)  # ceil division
    return [t[r * size : (r + 1) * size].clone() for r in range(world)]


def redistribute(parts, src, dst):
    """Local pieces after redistributing a 1-D DTensor from placement src to dst.

    Placements are "S" (Shard(0)), "R" (Replicate()) and "P" (Partial(), a sum)."""
    world = len(parts)
    if src == dst:
        return [p.clone() for p in parts]
    if src == "S":
        full = torch.cat(parts)  # all-gather
    elif src == "P":
        full = torch.stack(parts).sum(0)  # the reduction of all-reduce / reduce-scatter
    else:
        full = parts[0]  # a replica: every rank already has it all
    if dst == "R":
        return [full.clone() for _ in parts]
    if dst == "S":
        return shard(full, world)
    raise ValueError(f"{src} -> {dst} is not simulated here")

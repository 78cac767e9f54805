"""Lesson 09 exercises: collectives and DTensor redistributions, simulated in one process.

`parts` is a list with one 1-D tensor per rank (parts[r] is what rank r holds). Return a new
list in the same form. Check your answers with `make exercises N=09`: the tests compare them
with what the two ranks printed in the lesson and with DTensor's own sharding rule."""

import torch  # noqa: F401  (you will need it)


def all_reduce(parts):
    """Every rank ends with the elementwise sum of all ranks' tensors."""
    raise NotImplementedError


def reduce_scatter(parts):
    """Sum, then rank r keeps the r-th of len(parts) equal chunks (numel divides evenly)."""
    raise NotImplementedError


def shard(t, world):
    """DTensor's Shard(0) pieces of the 1-D tensor t over `world` ranks. Find the rule with
    the lesson's exercise B (torch.arange(5) on the worker): which rank gets the short
    piece, and what do ranks get when there are more ranks than elements?"""
    raise NotImplementedError


def redistribute(parts, src, dst):
    """Local pieces after redistributing a 1-D DTensor from placement src to dst.

    Placements are "S" (Shard(0)), "R" (Replicate()) and "P" (Partial(), a sum); support
    S->R, P->R, P->S, R->S, and src == dst."""
    raise NotImplementedError

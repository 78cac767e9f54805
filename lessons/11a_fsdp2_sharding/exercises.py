"""Lesson 11a exercises: FSDP2's shards, checked against what the two ranks printed.

Check your answers with `make exercises N=11a`."""


def local_numel(shapes, world, rank):
    """Elements rank `rank` of `world` holds when every parameter (a shape tuple in `shapes`)
    is sharded Shard(0) the way torch.chunk splits dim 0: pieces of ceil(n / world) rows,
    the last ones shorter or empty."""
    raise NotImplementedError

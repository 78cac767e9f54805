"""Lesson 11 solutions: FSDP2's arithmetic, checked against what the two ranks printed."""

import math


def local_numel(shapes, world, rank):
    """Elements this rank holds under Shard(0): torch.chunk's split of dim 0 into pieces of
    ceil(n / world) rows, times the elements per row."""
    total = 0
    for shape in shapes:
        rows, per_row = shape[0], math.prod(shape[1:])
        size = -(-rows // world)  # ceil division: torch.chunk's piece size
        mine = max(0, min(size, rows - rank * size))  # the last pieces are short or empty
        total += mine * per_row
    return total


def peak_param_bytes(root, blocks, world, elem, reshard):
    """Shards of everything, plus the units gathered at the worst moment."""
    shards = (root + sum(blocks)) // world
    if reshard is False:
        gathered = root + sum(blocks)  # every unit full from its forward to its backward
    else:
        gathered = root + max(blocks, default=0)  # the root all step, one block at a time
    return (shards + gathered) * elem


def max_params(gpu_bytes, world, bytes_per_param=16):
    """Sharded state per GPU is n * bytes_per_param / world <= gpu_bytes."""
    return int(gpu_bytes * world // bytes_per_param)

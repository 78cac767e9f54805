"""Lesson 11b solutions: FSDP2's memory arithmetic, checked against what the ranks printed."""


def peak_param_bytes(root, blocks, world, elem, reshard):
    """Shards of everything, plus the units gathered at the worst moment."""
    shards = (root + sum(blocks)) // world
    if reshard is False:
        gathered = root + sum(blocks)  # every unit full from its forward to its backward
    else:  # the root all step; in backward a block beside the one before it, prefetched
        pairs = [a + b for a, b in zip(blocks, blocks[1:])]
        gathered = root + max(pairs or blocks or [0])
    return (shards + gathered) * elem


def max_params(gpu_bytes, world, bytes_per_param=16):
    """Sharded state per GPU is n * bytes_per_param / world <= gpu_bytes."""
    return int(gpu_bytes * world // bytes_per_param)

"""Lesson 11 exercises: FSDP2's arithmetic, checked against what the two ranks printed.

Check your answers with `make exercises N=11`."""


def local_numel(shapes, world, rank):
    """Elements rank `rank` of `world` holds when every parameter (a shape tuple in `shapes`)
    is sharded Shard(0) the way torch.chunk splits dim 0: pieces of ceil(n / world) rows,
    the last ones shorter or empty."""
    raise NotImplementedError


def peak_param_bytes(root, blocks, world, elem, reshard):
    """A rank's parameter bytes at the peak of one forward + backward of a model sharded
    bottom-up: `root` elements in the root unit, `blocks` a list of the blocks' element
    counts, `elem` bytes per element. Every element is held as a shard (assume numel divides
    by world); gathered units are held in full on top. reshard is reshard_after_forward:
    None (the root stays gathered, one block at a time) or False (every unit stays gathered
    until its backward)."""
    raise NotImplementedError


def max_params(gpu_bytes, world, bytes_per_param=16):
    """The largest parameter count whose steady training state, fully sharded over `world`
    GPUs at `bytes_per_param` each, fits in `gpu_bytes` per GPU (an int, rounded down)."""
    raise NotImplementedError

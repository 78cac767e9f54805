"""Lesson 11b exercises: FSDP2's memory arithmetic, checked against what the ranks printed.

Check your answers with `make exercises N=11b`."""


def peak_param_bytes(root, blocks, world, elem, reshard):
    """A rank's parameter bytes at the peak of one forward + backward of a model sharded
    bottom-up, with FSDP2's default backward prefetch: `root` elements in the root unit,
    `blocks` a list of the blocks' element counts in forward order, `elem` bytes per
    element. Every element is held as a shard (assume numel divides by world); gathered
    units are held in full on top, and in backward a block's all-gather is issued when the
    unit after it (the next block, or the root for the last block) starts its backward.
    reshard is reshard_after_forward: None (the root stays gathered, the blocks are
    gathered only around their forward and backward) or False (every unit stays gathered
    until its backward)."""
    raise NotImplementedError


def max_params(gpu_bytes, world, bytes_per_param=16):
    """The largest parameter count whose steady training state, fully sharded over `world`
    GPUs at `bytes_per_param` each, fits in `gpu_bytes` per GPU (an int, rounded down)."""
    raise NotImplementedError

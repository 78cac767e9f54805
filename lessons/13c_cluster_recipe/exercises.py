"""Lesson 13c exercise: a tensor-parallel plan for a block with other names.

Replace the `raise NotImplementedError` with your code, then run `make exercises N=13c`: the
tests apply your plan to `HFBlock` (in `hf_block.py`) on a fake 2-rank tensor-parallel
mesh and check the placement of every weight, the layout of the block's output and the
collectives of one forward pass. Use the styles of `torch.distributed.tensor.parallel` only.
"""

from __future__ import annotations


def hf_block_plan() -> dict:
    """The sequence-parallel plan for `HFBlock`, as `parallelize_module(block, tp_mesh, plan)`
    takes it: a dict from a submodule's name to a `ParallelStyle`.

    - Between blocks the activations are split along the sequence (`Shard(1)` on the mesh)
      and passed as plain tensors, this rank's shard: the block takes a (B, S / tp, D)
      tensor and returns one (the styles' default `use_local_output=True`).
    - The two norms run on their sequence shard, their weights whole on every rank.
    - The attention and the MLP each gather the sequence once, at their input.
    - q/k/v and gate/up are split by output features, o_proj and down_proj by input
      features, and each of those two returns its partial sums reduce-scattered along the
      sequence.

    The lesson's `block_plan()` is this plan for torchtitan's names.
    """
    raise NotImplementedError

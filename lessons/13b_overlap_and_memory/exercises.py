"""Lesson 13b exercises: write data parallelism yourself.

Check your answers with `make exercises N=13b`: it runs your code on 2 gloo ranks (through the
course's kit) next to `nn.parallel.DistributedDataParallel` on the same model and data, and
compares gradients and parameters after 3 steps. Call the collectives as `dist.all_reduce(...)`
(the checker counts them and watches when you wait on their handles)."""

import torch  # noqa: F401  (you will need it)
import torch.distributed as dist  # noqa: F401


def all_reduce_grads(model):
    """(a) Naive data parallelism. Called after `loss.backward()` on every rank, before
    `opt.step()`: make every parameter's gradient the average of the ranks' gradients, in
    place, with one `dist.all_reduce` per gradient."""
    raise NotImplementedError


class Bucketed:
    """(b) Bucketed and overlapped data parallelism.

    `Bucketed(model, bucket_bytes)` groups the parameters into buckets of at most about
    `bucket_bytes` bytes of gradient (a parameter larger than that gets a bucket of its own)
    and registers `register_post_accumulate_grad_hook` on each parameter. As soon as every
    gradient of a bucket is ready, during backward, flatten the bucket's gradients into one
    tensor and launch `dist.all_reduce(flat, async_op=True)`; keep the handle. The first
    all-reduce must start while other gradients are still being computed, and do not wait
    in the hook: backward must go on while the bucket is on the wire.

    `finish()` is called after `loss.backward()` and before `opt.step()`, once per step: wait
    for every handle, average, and copy the result back into the gradients. Each step starts
    with empty buckets again."""

    def __init__(self, model, bucket_bytes):
        raise NotImplementedError

    def finish(self):
        raise NotImplementedError

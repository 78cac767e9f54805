"""Lesson 13b solutions: data parallelism written by hand, naive and bucketed + overlapped."""

import torch
import torch.distributed as dist


def all_reduce_grads(model):
    """After backward: one all-reduce (a sum) per gradient, then divide by the world size."""
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world


class Bucketed:
    """Parameters in buckets of about `bucket_bytes`, filled in reverse order (backward
    produces the last layers' gradients first). A post-accumulate-grad hook counts each
    bucket's ready gradients; the last one in launches the bucket's all-reduce, async."""

    def __init__(self, model, bucket_bytes):
        self.buckets, self.launched = [[]], []
        for p in reversed([p for p in model.parameters() if p.requires_grad]):
            size = sum(q.numel() * q.element_size() for q in self.buckets[-1])
            if self.buckets[-1] and size + p.numel() * p.element_size() > bucket_bytes:
                self.buckets.append([])
            self.buckets[-1].append(p)
        self.ready = [0] * len(self.buckets)
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self.grad_ready(i))

    def grad_ready(self, i):
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):  # the bucket is full: send it now
            flat = torch.cat([p.grad.flatten() for p in self.buckets[i]])
            self.launched.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        """Before opt.step(): wait for every bucket, average, copy back into the gradients."""
        world = dist.get_world_size()
        for i, flat, work in self.launched:
            work.wait()
            flat /= world
            for p, piece in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                p.grad.copy_(piece.view_as(p.grad))
        self.launched.clear()
        self.ready = [0] * len(self.buckets)

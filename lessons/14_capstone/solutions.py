"""Lesson 14: one way to solve the exercises (try exercises.py first)."""

import math

import torch


def lr_at(step, total, peak, warmup, floor=0.0):
    """The learning rate of training step `step`: linear warm-up, then cosine decay."""
    if step <= warmup:
        return peak * step / warmup
    progress = (step - warmup) / (total - warmup)  # 0 after the warm-up, 1 at the end
    return floor + (peak - floor) * (1 + math.cos(math.pi * progress)) / 2


class Shuffler:
    """Batches like DataLoader(shuffle=True, drop_last=True)'s (a new permutation each
    epoch, the last incomplete batch dropped), and its state."""

    def __init__(self, n, size, seed=0):
        self.n, self.size = n, size
        self.gen = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(n, generator=self.gen)  # this epoch's order
        self.pos = 0  # batches of this epoch already used

    def next(self):
        if (self.pos + 1) * self.size > self.n:  # the epoch is used up: a new permutation
            self.order, self.pos = torch.randperm(self.n, generator=self.gen), 0
        rows = self.order[self.pos * self.size:(self.pos + 1) * self.size]  # (size,)
        self.pos += 1
        return rows

    def state_dict(self):
        # the generator's state decides every later epoch; the order and the position, this one
        return {"gen": self.gen.get_state(), "order": self.order.clone(), "pos": self.pos}

    def load_state_dict(self, sd):
        self.gen.set_state(sd["gen"])
        self.order, self.pos = sd["order"].clone(), int(sd["pos"])

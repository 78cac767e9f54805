"""Lesson 10 exercises: tensor-parallel shards, the 1F1B order, and what scale_grads divides.

Check your answers with `make exercises N=10`: the tests compare them with what the two ranks
printed in the lesson."""

import torch  # noqa: F401  (you will need it)


def local_weight(w, rank, world, style):
    """The slice of an nn.Linear weight w ([out, in]) that `rank` of `world` holds under
    "colwise" (ColwiseParallel) or "rowwise" (RowwiseParallel); the dims divide evenly."""
    raise NotImplementedError


def one_f_one_b(p, m):
    """1F1B's action order for each of p stages and m micro-batches: a list of p lists of
    strings "F<i>" / "B<i>" (stage 0 first). Stage s runs p - 1 - s forwards as a warm-up
    (all m if m is smaller), then alternates one forward and one backward, then drains the remaining backwards."""
    raise NotImplementedError


def grad_scale(loss, divide_loss, scale_grads, m):
    """Pipeline gradient / full-batch gradient of the same loss kind, with m equal micro-batches.

    loss: "mean" or "sum" (per micro-batch, and the full-batch reference of the same kind);
    divide_loss: the loss function also divides by m; scale_grads: the schedule's flag."""
    raise NotImplementedError

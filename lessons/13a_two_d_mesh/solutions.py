"""Lesson 13a solutions: the ring model's bytes, per rank and leaving a node; TP-then-FSDP rows."""


def ring_bytes(kind, nbytes, n):
    """(n-1)/n of the full tensor for an all-gather or a reduce-scatter, twice for an all-reduce."""
    return nbytes * (n - 1) * (2 if kind == "all-reduce" else 1) // n


def leaving_node(kind, nbytes, groups, ranks_per_node):
    """Each rank sends its ring bytes to the next rank of its group; count node 0's crossing links."""
    total = 0
    for group in groups:
        for i, rank in enumerate(group):
            after = group[(i + 1) % len(group)]
            if rank // ranks_per_node == 0 and after // ranks_per_node != 0:
                total += ring_bytes(kind, nbytes, len(group))
    return total


def rows_held(rows, tp, dp, tp_rank, dp_rank):
    """TP first: tp_rank owns a contiguous block; FSDP splits that block over dp."""
    block = rows // tp
    piece = block // dp
    first = tp_rank * block + dp_rank * piece
    return first, first + piece - 1

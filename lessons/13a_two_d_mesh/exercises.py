"""Lesson 13a exercises: count what a collective sends, and where a shard lives.

Check your answers with `make exercises N=13a`: they run in one process (no ranks) and are
compared with the numbers part 13a printed."""


def ring_bytes(kind, nbytes, n):
    """Bytes one rank sends for one collective over `n` ranks with the ring algorithms.
    `kind` is "all-gather", "reduce-scatter" or "all-reduce"; `nbytes` is the size of the
    full tensor (an all-gather's output, a reduce-scatter's input, an all-reduce's tensor).
    Return an int (the sizes here divide evenly)."""
    raise NotImplementedError


def leaving_node(kind, nbytes, groups, ranks_per_node):
    """The bytes that leave node 0 (ranks 0 .. ranks_per_node - 1) when each group in
    `groups` (lists of ranks, e.g. [[0, 2], [1, 3]]) runs one collective of this kind on a
    tensor of `nbytes`. Ring model: in each group, every rank sends its ring bytes to the
    next rank of the group (in the order given, the last to the first); count what a rank
    of node 0 sends to a rank on another node."""
    raise NotImplementedError


def rows_held(rows, tp, dp, tp_rank, dp_rank):
    """(first, last) row that rank (dp_rank, tp_rank) holds of a colwise weight with `rows`
    rows, after tensor parallelism splits dim 0 over `tp` ranks and FSDP then splits that
    rank's TP shard over `dp` ranks (the `_StridedShard` layout of section 1)."""
    raise NotImplementedError

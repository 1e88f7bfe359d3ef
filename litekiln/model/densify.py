"""Densify TFLite sparse constants (the TACO-style format of schema.fbs SparsityParameters).

Mirrors TFLite's ``FormatConverter::Populate`` but expands one level at a time with numpy,
so that a sparse weight of a few hundred thousand values takes milliseconds, not seconds.
"""

from __future__ import annotations

import numpy as np

_DENSE, _SPARSE_CSR = 0, 1


def densify(
    values: np.ndarray,
    shape: tuple[int, ...],
    traversal_order: list[int],
    block_map: list[int],
    dim_metadata: list[tuple[int, int, np.ndarray | None, np.ndarray | None]],
) -> np.ndarray:
    """Expand a sparse constant into its dense array.

    Args:
        values: the stored (non-zero) values in traversal order.
        shape: the dense shape of the tensor.
        traversal_order: order of the (original + block) dimensions in storage.
        block_map: for each block dimension, the original dimension it subdivides.
        dim_metadata: per traversal level, ``(format, dense_size, segments, indices)``.

    Returns:
        The dense array of ``shape``, zeros where nothing is stored.

    Raises:
        ValueError: the sparsity description is inconsistent.
    """
    rank = len(shape)
    n_levels = len(traversal_order)
    if n_levels != len(dim_metadata) or n_levels < rank:
        raise ValueError(
            f"sparsity metadata has {len(dim_metadata)} levels, traversal order "
            f"{n_levels}, tensor rank {rank}"
        )
    if sorted(traversal_order[:rank]) != list(range(rank)):
        raise ValueError(f"traversal order {traversal_order} is not a permutation of the dims")
    if sorted(traversal_order[rank:]) != list(range(rank, n_levels)):
        raise ValueError(f"traversal order {traversal_order} does not list each block level once")
    if len(block_map) != n_levels - rank or any(not 0 <= d < rank for d in block_map):
        raise ValueError(
            f"block map {block_map} does not fit {n_levels - rank} block levels of rank {rank}"
        )
    block_sizes = [dim_metadata[traversal_order.index(rank + b)][1] for b in range(len(block_map))]
    for b, d in enumerate(block_map):
        if not 0 < block_sizes[b] <= max(shape[d], 1) or shape[d] % block_sizes[b]:
            raise ValueError(
                f"block size {block_sizes[b]} does not divide dimension {d} of {shape}"
            )
    # Every level's size is fixed by the dense shape: check it before expanding anything, so a
    # corrupted size fails at once instead of allocating gigabytes (found by fuzzing).
    expected = []
    for level in range(n_levels):
        d = traversal_order[level]
        if d < rank:
            blocks = [block_sizes[b] for b, m in enumerate(block_map) if m == d]
            size = shape[d] // blocks[0] if blocks and blocks[0] > 0 else shape[d]
        else:
            size = block_sizes[d - rank]
        expected.append(size)
    for level, (fmt, dense_size, _, _) in enumerate(dim_metadata):
        if fmt == _DENSE and dense_size != expected[level]:
            raise ValueError(
                f"level {level}: dense size {dense_size} does not match the shape {shape} "
                f"(expected {expected[level]})"
            )

    prev = np.zeros(1, np.int64)  # position in the parent level, per partial path
    cols: list[np.ndarray] = []  # chosen index per level, per partial path
    for level, (fmt, dense_size, segments, indices) in enumerate(dim_metadata):
        if fmt == _DENSE:
            if dense_size < 0:
                raise ValueError(f"level {level}: negative dense size {dense_size}")
            if prev.size * max(dense_size, 1) > 4 * (1 << 28):
                raise ValueError(f"level {level}: expansion too large")
            ar = np.arange(dense_size, dtype=np.int64)
            cols = [np.repeat(c, dense_size) for c in cols] + [np.tile(ar, prev.size)]
            prev = (prev[:, None] * dense_size + ar[None, :]).reshape(-1)
        elif fmt == _SPARSE_CSR:
            if segments is None or indices is None:
                raise ValueError(f"level {level}: sparse dimension without segments/indices")
            if prev.size and (prev.max() + 1 >= segments.size):
                raise ValueError(f"level {level}: segment array too short")
            starts, ends = segments[prev], segments[prev + 1]
            counts = ends - starts
            if (counts < 0).any() or (ends > indices.size).any():
                raise ValueError(f"level {level}: segments out of order or past the indices")
            total = int(counts.sum())
            # positions starts[i] .. ends[i]-1 for each path i, in order
            offsets = np.repeat(ends - counts.cumsum(), counts) + np.arange(total)
            cols = [np.repeat(c, counts) for c in cols] + [indices[offsets]]
            prev = offsets
        else:
            raise ValueError(f"level {level}: unknown dimension format {fmt}")

    n = prev.size
    if n != values.size:
        raise ValueError(f"sparsity metadata describes {n} values, buffer holds {values.size}")
    orig = [np.zeros(n, np.int64) for _ in range(rank)]
    for i in range(rank):
        orig[traversal_order[i]] = cols[i]
    for i in range(rank, n_levels):
        b = traversal_order[i] - rank
        d = block_map[b]
        orig[d] = orig[d] * block_sizes[b] + cols[i]
    dense = np.zeros(shape, dtype=values.dtype)
    if n:
        for d in range(rank):
            if (orig[d] < 0).any() or (orig[d] >= shape[d]).any():
                raise ValueError(f"sparse index out of range in dimension {d} of {shape}")
        dense[tuple(orig)] = values
    return dense

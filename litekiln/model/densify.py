"""Densify TFLite sparse constants (the TACO-style format of schema.fbs SparsityParameters).

Mirrors TFLite's ``FormatConverter::Populate`` but expands one level at a time with numpy,
so that a sparse weight of a few hundred thousand values takes milliseconds, not seconds.
"""

from __future__ import annotations

import numpy as np

_DENSE, _SPARSE_CSR = 0, 1

#: Per traversal level: ``(format, dense_size, segments, indices)``.
_DimMetadata = tuple[int, int, np.ndarray | None, np.ndarray | None]


def densify(
    values: np.ndarray,
    shape: tuple[int, ...],
    traversal_order: list[int],
    block_map: list[int],
    dim_metadata: list[_DimMetadata],
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
    _check_levels(shape, traversal_order, block_map, dim_metadata)
    block_sizes = _block_sizes(shape, traversal_order, block_map, dim_metadata)
    # Every level's size is fixed by the dense shape: check it before expanding anything, so a
    # corrupted size fails at once instead of allocating gigabytes (found by fuzzing).
    _check_dense_sizes(shape, traversal_order, block_map, block_sizes, dim_metadata)
    positions, cols = _expand_levels(dim_metadata)
    if positions.size != values.size:
        raise ValueError(
            f"sparsity metadata describes {positions.size} values, buffer holds {values.size}"
        )
    coords = _dense_coordinates(cols, len(shape), traversal_order, block_map, block_sizes)
    return _scatter(values, shape, coords)


def _check_levels(
    shape: tuple[int, ...],
    traversal_order: list[int],
    block_map: list[int],
    dim_metadata: list[_DimMetadata],
) -> None:
    """Check that the traversal order and block map describe the levels of a rank-n tensor."""
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


def _block_sizes(
    shape: tuple[int, ...],
    traversal_order: list[int],
    block_map: list[int],
    dim_metadata: list[_DimMetadata],
) -> list[int]:
    """The size of each block dimension, checked to divide the dimension it subdivides."""
    rank = len(shape)
    block_sizes = [dim_metadata[traversal_order.index(rank + b)][1] for b in range(len(block_map))]
    for b, d in enumerate(block_map):
        if not 0 < block_sizes[b] <= max(shape[d], 1) or shape[d] % block_sizes[b]:
            raise ValueError(
                f"block size {block_sizes[b]} does not divide dimension {d} of {shape}"
            )
    return block_sizes


def _check_dense_sizes(
    shape: tuple[int, ...],
    traversal_order: list[int],
    block_map: list[int],
    block_sizes: list[int],
    dim_metadata: list[_DimMetadata],
) -> None:
    """Check each dense level's size against the size the dense shape gives that level."""
    rank = len(shape)
    expected = []
    for level in range(len(traversal_order)):
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


def _expand_levels(dim_metadata: list[_DimMetadata]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Walk the levels in storage order, expanding every stored path one level at a time.

    Returns:
        ``(positions, cols)``: per stored value, its position in the last level (the index
        into the values) and, per level, the index chosen at that level.
    """
    prev = np.zeros(1, np.int64)  # position in the parent level, per partial path
    cols: list[np.ndarray] = []  # chosen index per level, per partial path
    repeats: int | np.ndarray  # how many times each partial path continues
    for level, (fmt, dense_size, segments, indices) in enumerate(dim_metadata):
        if fmt == _DENSE:
            col, repeats, prev = _expand_dense(level, dense_size, prev)
        elif fmt == _SPARSE_CSR:
            col, repeats, prev = _expand_csr(level, segments, indices, prev)
        else:
            raise ValueError(f"level {level}: unknown dimension format {fmt}")
        cols = [np.repeat(c, repeats) for c in cols] + [col]
    return prev, cols


def _expand_dense(
    level: int, dense_size: int, prev: np.ndarray
) -> tuple[np.ndarray, int, np.ndarray]:
    """One dense level: every partial path continues with each of ``dense_size`` indices.

    Returns:
        ``(col, repeats, positions)``: the index chosen at this level per new path, how many
        times each earlier path repeats, and each new path's position in this level.
    """
    if dense_size < 0:
        raise ValueError(f"level {level}: negative dense size {dense_size}")
    if prev.size * max(dense_size, 1) > 4 * (1 << 28):
        raise ValueError(f"level {level}: expansion too large")
    ar = np.arange(dense_size, dtype=np.int64)
    col = np.tile(ar, prev.size)
    return col, dense_size, (prev[:, None] * dense_size + ar[None, :]).reshape(-1)


def _expand_csr(
    level: int, segments: np.ndarray | None, indices: np.ndarray | None, prev: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One compressed (CSR) level: each partial path continues with its segment's indices.

    Returns:
        ``(col, repeats, positions)`` as for `_expand_dense`.
    """
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
    return indices[offsets], counts, offsets


def _dense_coordinates(
    cols: list[np.ndarray],
    rank: int,
    traversal_order: list[int],
    block_map: list[int],
    block_sizes: list[int],
) -> list[np.ndarray]:
    """Per dense dimension, each value's index: its level's index, block levels folded in."""
    # traversal_order[:rank] is a permutation of the dimensions (checked by `_check_levels`).
    orig = [cols[traversal_order.index(d)] for d in range(rank)]
    for i in range(rank, len(traversal_order)):
        b = traversal_order[i] - rank
        d = block_map[b]
        orig[d] = orig[d] * block_sizes[b] + cols[i]
    return orig


def _scatter(values: np.ndarray, shape: tuple[int, ...], coords: list[np.ndarray]) -> np.ndarray:
    """The dense array of ``shape`` holding ``values`` at ``coords``, zeros elsewhere."""
    dense = np.zeros(shape, dtype=values.dtype)
    if values.size:
        for d in range(len(shape)):
            if (coords[d] < 0).any() or (coords[d] >= shape[d]).any():
                raise ValueError(f"sparse index out of range in dimension {d} of {shape}")
        dense[tuple(coords)] = values
    return dense

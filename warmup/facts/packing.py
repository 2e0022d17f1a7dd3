"""Packing: the rows TRL's `pack_dataset` builds for SFT, computed from the examples' lengths alone."""

from __future__ import annotations

import array

from warmup.facts.recipe import Recipe

# `Dataset.map(batched=True)`'s default batch size, which SFTTrainer packs under: each batch is packed alone.
MAP_BATCH_SIZE = 1000


def packed_lengths(recipe: Recipe, lengths: array.array[int]) -> array.array[int]:
    """The rows TRL's `pack_dataset` builds from examples of these lengths, as SFTTrainer calls it.

    SFTTrainer shuffles (when shuffle_dataset) with its seed, then packs with `Dataset.map(batched=True)`:
    batches of 1000 examples, within `dataset_num_proc` contiguous shards. Each batch is packed here by
    TRL's own function on a table of placeholder tokens of the same lengths, so only one batch of tokens
    is ever in memory.
    """
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    from warmup._compat import trl as compat_trl

    order = np.frombuffer(lengths, dtype=np.uint32) if len(lengths) else np.zeros(0, dtype=np.uint32)
    if recipe.shuffle_dataset:
        order = order[np.random.default_rng(recipe.seed).permutation(len(order))]
    out = array.array("I")
    shards = max(1, min(recipe.dataset_num_proc or 1, len(order)))
    size, extra = divmod(len(order), shards)
    start = 0
    seq_length = int(recipe.max_length or 0)
    for shard in range(shards):
        stop = start + size + (1 if shard < extra else 0)
        for begin in range(start, stop, MAP_BATCH_SIZE):
            chunk = order[begin : min(begin + MAP_BATCH_SIZE, stop)]
            offsets = np.concatenate(([0], np.cumsum(chunk, dtype=np.int64))).astype(np.int64)
            values = pa.array(np.zeros(int(offsets[-1]), dtype=np.int8))
            table = pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), values)})
            packed = compat_trl.pack(table, seq_length, recipe.packing_strategy)
            column = packed.column("input_ids").combine_chunks()
            out.extend(int(n) for n in column.value_lengths().to_numpy(zero_copy_only=False))
        start = stop
    return out

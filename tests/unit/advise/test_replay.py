"""The replay's batching against the library classes it stands for, where it computes instead of iterating."""

from __future__ import annotations

import numpy as np
import pytest

from warmup.advise.simulate import Geometry, generation_batches, prompt_order


@pytest.mark.parametrize(
    ("world_size", "batch", "steps", "generations", "iterations"),
    [(1, 4, 3, 2, 2), (2, 3, 1, 2, 1), (3, 2, 2, 3, 2), (4, 5, 2, 4, 1)],
)
def test_generation_batches_are_what_each_process_loads(world_size, batch, steps, generations, iterations):
    """GRPO's stream (RepeatSampler -> BatchSampler of B x steps_per_generation -> accelerate's BatchSamplerShard
    per process), taking the batch of every step at which `_prepare_inputs` generates."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler
    from trl.trainer.utils import RepeatSampler

    examples, seed = 53, 17
    geometry = Geometry(
        trainer="grpo",
        batch=batch,
        world_size=world_size,
        multiple=None,
        seed=seed,
        sequential=False,
        drop_last=False,
        even_batches=True,
        num_generations=generations,
        steps_per_generation=steps,
        num_iterations=iterations,
    )
    local = batch * steps

    def loader(rank: int):
        """One process's batches, epoch after epoch: its own sampler, seeded alike on every process."""
        sampler = RepeatSampler(
            range(examples),
            mini_repeat_count=generations,
            batch_size=local * world_size // generations,
            repeat_count=steps * iterations,
            seed=seed,
        )
        batches = BatchSampler(sampler, local, drop_last=False)
        shard = BatchSamplerShard(batches, world_size, rank) if world_size > 1 else batches
        while True:
            yield list(shard)[:: steps * iterations]  # the batches `_prepare_inputs` generates from

    processes = [loader(rank) for rank in range(world_size)]
    orders = prompt_order(examples, geometry)
    for _ in range(2):  # two epochs: the sampler's generator carries on
        expected = np.asarray([next(p) for p in processes]).transpose(1, 0, 2)  # (rounds, processes, rows)
        assert np.array_equal(generation_batches(next(orders), geometry), expected)


@pytest.mark.parametrize("even_batches", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shard_positions_are_accelerates_batch_sampler_shard(drop_last, even_batches):
    """Every process's batches, as torch's BatchSampler and accelerate's BatchSamplerShard give them, for
    example counts around every boundary (fewer than one batch, than one batch per process, exact groups)."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from warmup.advise.simulate import shard_positions

    for world_size in (1, 2, 3, 5):
        for batch in (1, 3, 4):
            for examples in range(1, 3 * world_size * batch + 3):
                shards = shard_positions(examples, batch, world_size, drop_last, even_batches)
                batches = BatchSampler(range(examples), batch, drop_last)
                for rank in range(world_size):
                    expected = (
                        list(batches)
                        if world_size == 1
                        else list(BatchSamplerShard(batches, world_size, rank, even_batches=even_batches))
                    )
                    ours = [list(b) for b in shards.full[rank]]
                    ours += [list(p) for r, _, p in shards.tail if r == rank]
                    assert ours == [list(b) for b in expected], (world_size, batch, examples, rank)

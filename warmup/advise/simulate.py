"""The trainer's batching replayed on token lengths: which examples share a batch, and what padding costs.

The order of the examples is the Trainer's own, built with the same library classes it uses (TRL 1.16.0,
transformers 5.24, accelerate 1.15):

- SFT, DPO, Reward: transformers' `RandomSampler`, which accelerate's `prepare_data_loader` replaces with its
  `SeedableRandomSampler` (seeded with `data_seed`, else the `seed` the Trainer set; epoch e uses seed + e),
  or a `SequentialSampler` for `train_sampling_strategy: sequential`; batches of per_device_train_batch_size
  from torch's `BatchSampler`; with several processes, accelerate's `BatchSamplerShard` (process k takes batch
  k, k + W, ...; with `even_batches` the last ones are filled from the start of the epoch).
- GRPO / RLOO: TRL's `RepeatSampler` (a generator seeded with `seed` once, so epoch e is its e-th
  permutation; incomplete generation chunks dropped), each prompt repeated num_generations times and each
  chunk repeat_count times; process k's generation batch is the k-th slice of per_device_train_batch_size x
  steps_per_generation rows of the chunk, which is what `BatchSamplerShard` gives it.

Then each batch is padded as TRL pads it: to ceil_m(longest row of the batch), with DPO / Reward stacking the
chosen rows over the rejected rows, and GRPO / RLOO padding the prompts (left) and completions (right) over the
whole generation batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator

import numpy as np

from warmup.advise.data import ONLINE_TRAINERS, PreparedSplit

# Forward-only passes cost about a third of a forward + backward per token (2N against 6N FLOPs).
FORWARD_ONLY_WEIGHT = 1.0 / 3.0


@dataclasses.dataclass(frozen=True)
class EpochWork:
    """One epoch of training as the processes run it in lockstep."""

    micro_work: np.ndarray  # per micro-step: the slowest process's work, in forward+backward padded tokens
    padded: int  # tokens in the tensors TRL's padding builds this epoch, all processes
    real: int  # the non-padding tokens among them


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How the trainer batches, from its resolved config and the target."""

    trainer: str
    batch: int  # per_device_train_batch_size
    world_size: int
    multiple: int | None  # pad_to_multiple_of
    seed: int  # data_seed, else seed
    sequential: bool  # train_sampling_strategy sequential (or shuffle_dataset false for GRPO / RLOO)
    drop_last: bool
    even_batches: bool
    # DPO: the reference forward runs every step (not precomputed)
    reference_every_step: bool = False
    precompute_batch: int | None = None  # DPO precompute_ref_log_probs: its batch size
    # GRPO / RLOO
    num_generations: int = 1
    steps_per_generation: int = 1
    num_iterations: int = 1
    completion_tokens: int = 0  # the assumed length of every completion
    forward_passes: int = 0  # forward-only passes over each generation batch: old log-probs, reference


def ceil_to(values: np.ndarray, multiple: int | None) -> np.ndarray:
    """TRL's `pad`: round each padded length up to a multiple (trl/trainer/utils.py)."""
    if not multiple:
        return values
    return -(-values // multiple) * multiple


def epochs(split: PreparedSplit, geometry: Geometry) -> Iterator[EpochWork]:
    """Every epoch's work, epoch 0 first, without end."""
    if geometry.trainer in ONLINE_TRAINERS:
        yield from _online_epochs(split, geometry)
    else:
        yield from _offline_epochs(split, geometry)


def upfront_work(split: PreparedSplit, geometry: Geometry) -> float:
    """Work before the first step: DPO's reference precompute, one sequential forward pass over the data."""
    if geometry.precompute_batch is None:
        return 0.0
    positions = shard_positions(split.examples, geometry.precompute_batch, geometry.world_size, False, True)
    order = np.arange(split.examples)  # its own DataLoader, shuffle=False
    slowest = np.zeros(max(len(p) for p in positions))
    for rank_positions in positions:
        for step, rows, width in _padded_batches(split, order, rank_positions, geometry.multiple):
            slowest[step] = max(slowest[step], float(rows.size * width))
    return float(slowest.sum()) * FORWARD_ONLY_WEIGHT


# --- SFT, DPO, Reward ---------------------------------------------------------------------------------


def epoch_order(examples: int, seed: int, epoch: int, *, sequential: bool) -> np.ndarray:
    """The Trainer's sampler order for one epoch (single process and every process alike)."""
    if sequential:
        return np.arange(examples)
    from accelerate.data_loader import SeedableRandomSampler

    sampler = SeedableRandomSampler(range(examples), data_seed=seed)
    sampler.set_epoch(epoch)
    return np.fromiter(iter(sampler), dtype=np.int64, count=examples)


@functools.lru_cache(maxsize=32)
def shard_positions(
    examples: int, batch: int, world_size: int, drop_last: bool, even_batches: bool
) -> tuple[tuple[np.ndarray, ...], ...]:
    """Per process, its batches as positions in the epoch's order, from torch's and accelerate's samplers.

    One process is left alone by accelerate (a short last batch); several go through `BatchSamplerShard`.
    """
    from torch.utils.data import BatchSampler

    batches = BatchSampler(range(examples), batch, drop_last)
    if world_size == 1:
        return (tuple(np.asarray(b, dtype=np.int64) for b in batches),)
    from accelerate.data_loader import BatchSamplerShard

    return tuple(
        tuple(
            np.asarray(b, dtype=np.int64)
            for b in BatchSamplerShard(
                batches, world_size, rank, split_batches=False, even_batches=even_batches
            )
        )
        for rank in range(world_size)
    )


def _offline_epochs(split: PreparedSplit, geometry: Geometry) -> Iterator[EpochWork]:
    positions = shard_positions(
        split.examples, geometry.batch, geometry.world_size, geometry.drop_last, geometry.even_batches
    )
    steps = max(len(p) for p in positions)
    weight = 1.0 + (FORWARD_ONLY_WEIGHT if geometry.reference_every_step else 0.0)
    epoch = 0
    while True:
        order = epoch_order(split.examples, geometry.seed, epoch, sequential=geometry.sequential)
        slowest = np.zeros(steps)
        padded = real = 0
        for rank_positions in positions:
            for step, rows, width in _padded_batches(split, order, rank_positions, geometry.multiple):
                tokens = rows.size * width  # chosen and rejected rows stacked: 2B x width
                slowest[step] = max(slowest[step], tokens * weight)
                padded += tokens
                real += int(rows.sum())
        yield EpochWork(micro_work=slowest, padded=padded, real=real)
        epoch += 1


def _padded_batches(
    split: PreparedSplit, order: np.ndarray, positions: tuple[np.ndarray, ...], multiple: int | None
) -> Iterator[tuple[int, np.ndarray, int]]:
    """(step, rows of the batch, padded width) for each batch of one process, the full batches at once."""
    if not positions:
        return
    count = len(positions) - (len(positions[-1]) != len(positions[0]))  # a short last batch goes alone
    if count:
        stacked = split.rows[order[np.stack(positions[:count])]]  # (batches, B, rows per example)
        widths = ceil_to(stacked.reshape(count, -1).max(axis=1), multiple)
        for step in range(count):
            yield step, stacked[step], int(widths[step])
    for step in range(count, len(positions)):
        rows = split.rows[order[positions[step]]]
        yield step, rows, int(ceil_to(np.asarray(rows.max()), multiple))


# --- GRPO, RLOO ---------------------------------------------------------------------------------------


def prompt_order(examples: int, geometry: Geometry) -> Iterator[np.ndarray]:
    """The prompts of each epoch in TRL's RepeatSampler order, whole generation chunks only."""
    from trl.trainer.utils import RepeatSampler

    chunk = _chunk_prompts(geometry)
    sampler = RepeatSampler(
        range(examples),
        mini_repeat_count=1,
        batch_size=chunk,
        shuffle=not geometry.sequential,
        seed=geometry.seed,
    )
    while True:
        yield np.fromiter(iter(sampler), dtype=np.int64)


def _chunk_prompts(geometry: Geometry) -> int:
    """Prompts per global generation batch: generation_batch_size / num_generations."""
    rows = geometry.batch * geometry.steps_per_generation * geometry.world_size
    return rows // geometry.num_generations


def generation_batches(order: np.ndarray, geometry: Geometry) -> np.ndarray:
    """(rounds, processes, rows) prompt indices: each process's generation batch of each round.

    A chunk's prompts each repeated num_generations times, cut into per_device_train_batch_size x
    steps_per_generation rows per process, in process order (BatchSamplerShard's batch k of each chunk).
    """
    chunk = _chunk_prompts(geometry)
    rounds = len(order) // chunk
    rows = np.repeat(order[: rounds * chunk].reshape(rounds, chunk), geometry.num_generations, axis=1)
    return rows.reshape(rounds, geometry.world_size, geometry.batch * geometry.steps_per_generation)


def _online_epochs(split: PreparedSplit, geometry: Geometry) -> Iterator[EpochWork]:
    local_rows = geometry.batch * geometry.steps_per_generation
    completion = geometry.completion_tokens
    completion_width = int(ceil_to(np.asarray(completion), geometry.multiple)) if completion else 0
    micro_per_round = geometry.steps_per_generation * geometry.num_iterations
    prompts = split.rows[:, 0]
    for order in prompt_order(split.examples, geometry):
        rows = generation_batches(order, geometry)
        rounds = len(rows)
        lengths = prompts[rows]
        prompt_width = ceil_to(lengths.max(axis=2), geometry.multiple)  # (rounds, processes)
        width = prompt_width + completion_width
        padded = int(width.sum()) * local_rows
        real = int(lengths.sum()) + completion * local_rows * geometry.world_size * rounds
        # Per micro-step: B rows forward + backward at the round's width. At the first micro-step of a round the
        # forward-only passes run over the whole generation batch, and so does the prefill over the prompts.
        slowest_width = width.max(axis=1)
        train = geometry.batch * slowest_width
        forward = (
            local_rows * (geometry.forward_passes * width + prompt_width).max(axis=1) * FORWARD_ONLY_WEIGHT
        )
        micro = np.repeat(train.astype(float), micro_per_round).reshape(rounds, micro_per_round)
        micro[:, 0] += forward
        yield EpochWork(micro_work=micro.ravel(), padded=padded, real=real)


# --- steps ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobWork:
    steps: int  # optimizer steps of the whole job
    work: float  # forward+backward padded tokens of the slowest process, summed over the job
    first_epoch: EpochWork


def job_work(
    split: PreparedSplit,
    geometry: Geometry,
    *,
    gradient_accumulation_steps: int,
    num_train_epochs: float,
    max_steps: int,
) -> JobWork:
    """The whole job: optimizer steps as transformers counts them (set_initial_training_values), each
    consuming gradient_accumulation_steps micro-steps, the last of an epoch fewer."""
    stream = epochs(split, geometry)
    first = next(stream)
    per_epoch = len(first.micro_work)
    if per_epoch == 0:
        return JobWork(steps=0, work=upfront_work(split, geometry), first_epoch=first)
    steps_per_epoch = max(math.ceil(per_epoch / gradient_accumulation_steps), 1)
    total_steps = max_steps if max_steps > 0 else math.ceil(num_train_epochs * steps_per_epoch)
    work, left, epoch = upfront_work(split, geometry), total_steps, first
    while left > 0:
        steps = min(left, steps_per_epoch)
        work += float(epoch.micro_work[: steps * gradient_accumulation_steps].sum())
        left -= steps
        if left > 0:
            epoch = next(stream)
    return JobWork(steps=total_steps, work=work, first_epoch=first)

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

from warmup.advise.data import PreparedSplit
from warmup.trainers.registry import family

# Epochs replayed in their own order; the job's later epochs count as their mean.
REPLAYED_EPOCHS = 4
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
    if family(geometry.trainer).generation_groups:
        yield from _online_epochs(split, geometry)
    else:
        yield from _offline_epochs(split, geometry)


def upfront_work(split: PreparedSplit, geometry: Geometry) -> float:
    """Work before the first step: DPO's reference precompute, one sequential forward pass over the data."""
    if geometry.precompute_batch is None:
        return 0.0
    shards = shard_positions(split.examples, geometry.precompute_batch, geometry.world_size, False, True)
    tokens, _ = batch_tokens(split, np.arange(split.examples), shards, geometry.multiple)  # shuffle=False
    return float(_slowest(tokens, shards.steps).sum()) * FORWARD_ONLY_WEIGHT


# --- SFT, DPO, Reward ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def epoch_order(examples: int, seed: int, epoch: int, *, sequential: bool) -> np.ndarray:
    """The Trainer's sampler order for one epoch (single process and every process alike). Cached: the
    options that keep every example share it, and iterating the sampler costs a second per million."""
    if sequential:
        order = np.arange(examples)
    else:
        from accelerate.data_loader import SeedableRandomSampler

        sampler = SeedableRandomSampler(range(examples), data_seed=seed)
        sampler.set_epoch(epoch)
        order = np.fromiter(iter(sampler), dtype=np.int64, count=examples)
    order.setflags(write=False)
    return order


@dataclasses.dataclass(frozen=True)
class Shards:
    """Every process's batches of one epoch, as positions in the epoch's order."""

    full: np.ndarray  # (processes, steps, batch): the first `steps` batches of every process, all full
    tail: tuple[tuple[int, int, np.ndarray], ...]  # (process, step, positions): the batches after those

    @property
    def steps(self) -> int:
        return max([int(self.full.shape[1]), *(step + 1 for _, step, _ in self.tail)])


@functools.lru_cache(maxsize=32)
def shard_positions(
    examples: int, batch: int, world_size: int, drop_last: bool, even_batches: bool
) -> Shards:
    """Per process, its batches as positions in the epoch's order.

    One process is left alone by accelerate: torch's BatchSampler, a short last batch unless drop_last.
    Several: accelerate's `BatchSamplerShard._iter_with_no_split` (split_batches off), computed for all
    processes in one pass rather than by iterating the sampler once per process (processes x examples
    steps: minutes for hundreds of processes); `tests/unit/advise/test_replay.py` holds it equal to the class.
    """
    batches = [np.arange(s, min(s + batch, examples), dtype=np.int64) for s in range(0, examples, batch)]
    if drop_last and batches and len(batches[-1]) < batch:
        batches.pop()
    per_process: list[list[np.ndarray]] = [[] for _ in range(world_size)]
    if world_size == 1:
        per_process[0] = batches
    else:
        _shard(batches, batch, world_size, drop_last=drop_last, even_batches=even_batches, out=per_process)
    common = min(_leading_full(process, batch) for process in per_process)
    full = np.asarray([process[:common] for process in per_process], dtype=np.int64)
    tail = tuple(
        (rank, step, positions)
        for rank, process in enumerate(per_process)
        for step, positions in enumerate(process)
        if step >= common
    )
    return Shards(full=full.reshape(world_size, common, batch), tail=tail)


def _leading_full(batches: list[np.ndarray], size: int) -> int:
    count = 0
    while count < len(batches) and len(batches[count]) == size:
        count += 1
    return count


def _shard(
    batches: list[np.ndarray],
    size: int,
    world_size: int,
    *,
    drop_last: bool,
    even_batches: bool,
    out: list[list[np.ndarray]],
) -> None:
    """BatchSamplerShard: process r takes batch i when i % W == r, a group of W batches at a time once the
    group's last batch is full; then, unless drop_last, the batches of the group left over, and with
    even_batches batches filled from the start of the epoch until every process has as many."""
    count, yielded = len(batches), 0
    for group in range(count // world_size):
        members = batches[group * world_size : (group + 1) * world_size]
        if len(members[-1]) != size:
            break  # only the last group can end short; it is handled below
        for rank, positions in enumerate(members):
            out[rank].append(positions)
        yielded = (group + 1) * world_size
    if drop_last or not batches:
        return
    pending = batches[yielded:]
    if not even_batches:
        for offset, positions in enumerate(pending):
            out[offset % world_size].append(positions)
        return
    for offset, positions in enumerate(pending):
        if len(positions) == size:
            out[offset % world_size].append(positions)
    initial = np.concatenate(batches[:world_size])
    while len(initial) < world_size * size:
        initial = np.concatenate([initial, initial])
    index, current = count, np.empty(0, dtype=np.int64)
    if len(batches[-1]) != size:  # the short last batch is completed from the start of the epoch
        index, current = count - 1, batches[-1]
    cycle = 0
    while index % world_size != 0 or len(current) > 0:
        end = cycle + size - len(current)
        out[index % world_size].append(np.concatenate([current, initial[cycle:end]]))
        cycle, current, index = end, np.empty(0, dtype=np.int64), index + 1


def _offline_epochs(split: PreparedSplit, geometry: Geometry) -> Iterator[EpochWork]:
    shards = shard_positions(
        split.examples, geometry.batch, geometry.world_size, geometry.drop_last, geometry.even_batches
    )
    weight = 1.0 + (FORWARD_ONLY_WEIGHT if geometry.reference_every_step else 0.0)
    epoch = 0
    while True:
        order = epoch_order(split.examples, geometry.seed, epoch, sequential=geometry.sequential)
        tokens, real = batch_tokens(split, order, shards, geometry.multiple)
        yield EpochWork(
            micro_work=_slowest(tokens, shards.steps) * weight, padded=int(tokens[0].sum()), real=real
        )
        epoch += 1


def batch_tokens(
    split: PreparedSplit, order: np.ndarray, shards: Shards, multiple: int | None
) -> tuple[np.ndarray, int]:
    """For one epoch: (padded tokens of every batch of every process, and each one's step), and the real
    tokens of them all. A batch's tensor is rows x ceil_m(its longest row); DPO / Reward stack the chosen
    rows over the rejected rows (2B rows)."""
    processes, steps, size = shards.full.shape
    rows = split.rows[order[shards.full]]  # (processes, steps, batch, rows per example)
    widths = ceil_to(rows.reshape(processes, steps, -1).max(axis=2, initial=0), multiple)
    padded = [(widths * size * split.rows.shape[1]).ravel()]
    step_of = [np.tile(np.arange(steps), processes)]
    real = int(rows.sum())
    for _, step, positions in shards.tail:
        tail = split.rows[order[positions]]
        padded.append(np.asarray([int(ceil_to(np.asarray(tail.max()), multiple)) * tail.size]))
        step_of.append(np.asarray([step]))
        real += int(tail.sum())
    return np.stack([np.concatenate(padded), np.concatenate(step_of)]), real


def _slowest(tokens: np.ndarray, steps: int) -> np.ndarray:
    """Per step, the largest padded tokens of any process (the processes step in lockstep)."""
    slowest = np.zeros(steps)
    np.maximum.at(slowest, tokens[1], tokens[0].astype(float))
    return slowest


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
    consuming gradient_accumulation_steps micro-steps, the last of an epoch fewer. The first
    REPLAYED_EPOCHS epochs are replayed in their own orders; later ones count as their mean (a job of
    many epochs over a small dataset would otherwise replay each)."""
    stream = epochs(split, geometry)
    first = next(stream)
    per_epoch = len(first.micro_work)
    if per_epoch == 0:
        return JobWork(steps=0, work=upfront_work(split, geometry), first_epoch=first)
    steps_per_epoch = max(math.ceil(per_epoch / gradient_accumulation_steps), 1)
    total_steps = max_steps if max_steps > 0 else math.ceil(num_train_epochs * steps_per_epoch)
    work, left = upfront_work(split, geometry), total_steps
    replayed: list[EpochWork] = []
    while left > 0 and len(replayed) < REPLAYED_EPOCHS:
        epoch = next(stream) if replayed else first
        replayed.append(epoch)
        steps = min(left, steps_per_epoch)
        work += float(epoch.micro_work[: steps * gradient_accumulation_steps].sum())
        left -= steps
    if left > 0:
        mean = np.mean([epoch.micro_work for epoch in replayed], axis=0)
        full, rest = divmod(left, steps_per_epoch)
        work += full * float(mean.sum()) + float(mean[: rest * gradient_accumulation_steps].sum())
    return JobWork(steps=total_steps, work=work, first_epoch=first)

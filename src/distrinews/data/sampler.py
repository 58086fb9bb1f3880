"""Which rows each rank reads, in which order: the training sampler (length grouping, resume offset) and the eval
shard."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler

from .tokenized import TokenizedDataset


class TrainSampler(DistributedSampler[int]):
    """``DistributedSampler`` (rank r takes every world-size-th index of a seeded per-epoch permutation) with optional
    length grouping and a resume offset (``set_epoch(epoch, skip=n)`` drops this rank's first n samples).

    ``batch_size`` is a rank's rows per optimizer step. With grouping, the permutation is cut into mega-batches of
    ``50 x batch x world`` rows, each sorted by length, then into global batches of ``batch x world`` dealt out
    round-robin: every rank's batch k has rows of similar length, and the ranks' batch k together are the same rows
    whatever the split into ranks, so 2 x B and 1 x 2B see the same samples.
    """

    MEGABATCH_MULT = 50

    def __init__(
        self, dataset: TokenizedDataset, num_replicas: int, rank: int, batch_size: int, seed: int, group_by_length: bool
    ):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.batch_size, self.group_by_length = batch_size, group_by_length
        self.lengths, self.skip = dataset.lengths, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = skip

    def _rank_indices(self) -> list[int]:
        if not self.group_by_length:
            return list(super().__iter__())
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        order += order[: self.total_size - len(order)]  # pad like DistributedSampler
        global_batch = self.batch_size * self.num_replicas
        mega = global_batch * self.MEGABATCH_MULT
        batches: list[list[int]] = []
        for start in range(0, len(order), mega):
            chunk = order[start : start + mega]
            chunk.sort(key=lambda i: -int(self.lengths[i]))  # stable: ties keep permutation order
            batches += [chunk[b : b + global_batch] for b in range(0, len(chunk), global_batch)]
        full = len(order) // global_batch  # a last, partial batch stays last
        shuffled = [batches[i] for i in torch.randperm(full, generator=g).tolist()] + batches[full:]
        return [i for batch in shuffled for i in batch[self.rank :: self.num_replicas]]

    def __iter__(self) -> Iterator[int]:
        return iter(self._rank_indices()[self.skip :])

    def __len__(self) -> int:
        return self.num_samples - self.skip


def eval_shard(lengths: torch.Tensor, rank: int, world_size: int) -> list[int]:
    """This rank's share of the eval rows (i % world_size == rank: no padding, no duplicates, so the ranks' summed
    counts are exact for any world size), longest first."""
    mine = list(range(rank, lengths.numel(), world_size))
    mine.sort(key=lambda i: -int(lengths[i]))
    return mine

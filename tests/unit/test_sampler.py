import pytest
import torch

from distrinews.data.sampler import TrainSampler, eval_shard
from distrinews.data.tokenized import TokenizedDataset


def dataset(n: int, seed: int = 0) -> TokenizedDataset:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 60, (n,), generator=g)
    offsets = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return TokenizedDataset(
        torch.ones(int(offsets[-1]), dtype=torch.int32), offsets, torch.zeros(n, dtype=torch.int64), 0
    )


@pytest.mark.parametrize("group", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_are_disjoint_and_cover_the_data(group, world):
    ds = dataset(1200)
    shards = []
    for rank in range(world):
        s = TrainSampler(ds, world, rank, batch_size=8, seed=7, group_by_length=group)
        s.set_epoch(0)
        shards.append(list(s))
    assert all(len(sh) == len(shards[0]) for sh in shards)
    if 1200 % world == 0:
        assert sorted(i for sh in shards for i in sh) == list(range(1200))
        for a in range(world):
            for b in range(a + 1, world):
                assert not set(shards[a]) & set(shards[b])


@pytest.mark.parametrize("group", [False, True])
def test_uneven_size_is_padded_like_distributed_sampler(group):
    ds = dataset(1001)
    shards = [list(TrainSampler(ds, 2, r, 8, 7, group)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 501
    assert set(shards[0]) | set(shards[1]) == set(range(1001))


@pytest.mark.parametrize("group", [False, True])
def test_epoch_changes_order_and_seed_repeats_it(group):
    ds = dataset(500)

    def order(seed, epoch):
        s = TrainSampler(ds, 2, 0, 8, seed, group)
        s.set_epoch(epoch)
        return list(s)

    assert order(3, 0) == order(3, 0)
    assert order(3, 0) != order(3, 1)
    assert order(3, 0) != order(4, 0)
    assert sorted(order(3, 0)) != order(3, 0)


def test_global_batches_do_not_depend_on_how_they_are_split():
    """Batch k of 2 ranks x B holds the same rows as batch k of 1 rank x 2B (what DDP equivalence needs)."""
    ds = dataset(640)
    for group in (False, True):
        one = TrainSampler(ds, 1, 0, 16, 5, group)
        two = [TrainSampler(ds, 2, r, 8, 5, group) for r in range(2)]
        a, b = list(one), [list(s) for s in two]
        for k in range(640 // 16):
            assert set(a[16 * k : 16 * k + 16]) == set(b[0][8 * k : 8 * k + 8]) | set(b[1][8 * k : 8 * k + 8])


def test_length_grouping_makes_batches_homogeneous():
    ds = dataset(3200)
    lengths = ds.lengths

    def spread(group):
        s = TrainSampler(ds, 2, 0, 16, 1, group)
        idx = list(s)
        batches = [idx[i : i + 16] for i in range(0, len(idx), 16)]
        return sum(int(lengths[b].max() - lengths[b].min()) for b in batches) / len(batches)

    assert spread(True) < spread(False) / 4


def test_grouped_batches_come_in_a_seeded_random_order_with_a_partial_one_last():
    """Grouping sorts each mega-batch by length and cuts it into batches; the batches then come in a random order
    (seeded per epoch), so an epoch is not a sweep from the longest rows to the shortest, which would leave the
    last steps of a run, at its smallest learning rates, all on short rows. The batches themselves (and so the
    padding) are the sorted cut's."""
    ds = dataset(3200 + 8)  # 200 full batches of 16 and a partial one of 8
    lengths = ds.lengths
    idx = list(TrainSampler(ds, 1, 0, 16, seed=1, group_by_length=True))
    batches = [idx[k : k + 16] for k in range(0, len(idx), 16)]
    assert [len(b) for b in batches[-2:]] == [16, 8]
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(1)).tolist()
    sorted_cut = []
    for start in range(0, len(order), 16 * 50):
        chunk = sorted(order[start : start + 16 * 50], key=lambda i: -int(lengths[i]))
        sorted_cut += [frozenset(chunk[b : b + 16]) for b in range(0, len(chunk), 16)]
    assert sorted(map(frozenset, batches), key=sorted) == sorted(sorted_cut, key=sorted), (
        "the same batches as the sorted cut"
    )
    assert frozenset(batches[-1]) == sorted_cut[-1], "the last (partial or padded) batch stays last"
    longest = [int(lengths[b].max()) for b in batches]
    fifth = len(longest) // 5
    first, last = sum(longest[:fifth]) / fifth, sum(longest[-fifth:]) / fifth
    assert abs(first - last) < 0.2 * first, (first, last)  # in sorted order 37 against 26 tokens


def test_skip_resumes_mid_epoch():
    ds = dataset(300)
    s = TrainSampler(ds, 2, 1, 8, 9, True)
    s.set_epoch(2)
    full = list(s)
    s.set_epoch(2, skip=40)
    assert list(s) == full[40:] and len(s) == len(full) - 40
    s.set_epoch(3)
    assert len(s) == len(full)


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_eval_shards_cover_each_row_exactly_once(world):
    lengths = torch.randint(1, 50, (7600,))
    rows = [i for r in range(world) for i in eval_shard(lengths, r, world)]
    assert sorted(rows) == list(range(7600))


@pytest.mark.parametrize("group", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", [97, 401, 1001])
@pytest.mark.parametrize("batch,accum,max_steps", [(8, 1, -1), (5, 3, -1), (8, 2, 7), (16, 1, 1000)])
def test_every_rank_runs_the_same_steps_whatever_the_sizes(group, world, rows, batch, accum, max_steps):
    """The policy for uneven data: the sampler pads the data like DistributedSampler (repeating a few
    rows) and deals whole optimizer steps, so every rank sees ceil(rows / world) rows, the same number
    of micro-batches and optimizer steps, and the same shortened last window. No rank ever waits in a
    gradient all-reduce that another rank will not reach; ``Join`` is not needed."""
    from distrinews.config import TrainConfig
    from distrinews.train.build import StepPlan
    from distrinews.train.components import optimizer_windows

    ds = dataset(rows)
    config = TrainConfig(per_device_train_batch_size=batch, gradient_accumulation_steps=accum, max_steps=max_steps)
    per_rank = []
    for rank in range(world):
        sampler = TrainSampler(ds, world, rank, batch * accum, seed=3, group_by_length=group)
        sampler.set_epoch(0)
        indices = list(sampler)
        micro = [indices[i : i + batch] for i in range(0, len(indices), batch)]
        windows = [len(w) for w in optimizer_windows(micro, accum)]
        plan = StepPlan.of(config.batches, len(sampler))
        assert len(indices) == -(-rows // world) and len(micro) == plan.micro_per_epoch
        assert len(windows) == plan.steps_per_epoch
        per_rank.append((windows, plan))
    assert all(p == per_rank[0] for p in per_rank), "identical windows and plans on every rank"

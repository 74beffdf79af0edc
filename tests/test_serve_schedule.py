"""The attach server's scheduler on its own: exactly once per consumer epoch, sharing among
staggered consumers, eviction under a small budget, and a departed consumer's share let go."""
import numpy as np
import pytest

from enspipe.serve.schedule import Scheduler


def _drive(s: Scheduler, steps: list[tuple[int, int]], epochs_of: dict, ahead: int = 1, made_delay: int = 0):
    """Run ``steps`` of ``(consumer, how many takes)`` in turn, making whatever is planned at once."""
    for cid, takes in steps:
        for _ in range(takes):
            while True:
                t = s.take(cid)
                if t is not None:
                    break
                jobs = s.plan(cid, s.wanted(cid, ahead))
                assert jobs or s.making, "the scheduler stalled"
                for _, slot in jobs:
                    s.made_one(slot)
            epochs_of.setdefault(cid, {}).setdefault(t.epoch, []).extend(t.samples)
            s.release(cid, t.slots)
            for _, slot in s.plan(cid, s.wanted(cid, ahead)):
                s.made_one(slot)


def test_one_consumer_gets_every_sample_once_per_epoch_in_a_new_order():
    s = Scheduler(100, slots=40, batch=8, seed=1)
    s.attach(0)
    got = {}
    _drive(s, [(0, 13 * 3)], got)  # ceil(100/8) = 13 batches per epoch
    assert sorted(got[0]) == [0, 1, 2]
    for e in range(3):
        assert sorted(got[0][e]) == list(range(100))
    assert got[0][0] != got[0][1] != got[0][2]
    assert s.given == 300 and 300 <= s.made <= 300 + 2 * 8  # and the next epoch's prefetched batches


def test_one_consumer_order_is_a_uniform_permutation():
    """Where sample 0 lands over many epochs: every position about equally often."""
    s = Scheduler(10, slots=20, batch=2, seed=3)
    s.attach(0)
    got = {}
    _drive(s, [(0, 5 * 2000)], got)
    where = np.array([got[0][e].index(0) for e in range(2000)])
    counts = np.bincount(where, minlength=10)
    assert counts.min() > 140 and counts.max() < 260, counts  # 200 expected each (chi-square-sized spread)


def test_staggered_consumers_share_and_each_gets_exact_epochs():
    s = Scheduler(64, slots=64, batch=8, seed=0)
    got = {}
    s.attach(0)
    _drive(s, [(0, 4)], got)          # half an epoch ahead
    s.attach(1)
    for _ in range(40):
        _drive(s, [(0, 1), (1, 1)], got)
    for cid in (0, 1):
        done = [e for e in got[cid] if len(got[cid][e]) == 64]
        assert done and all(sorted(got[cid][e]) == list(range(64)) for e in done)
    assert s.given / s.made > 1.8, (s.given, s.made)


def test_a_small_pool_evicts_for_a_lagging_consumer_and_counts_it():
    s = Scheduler(200, slots=48, batch=8, seed=0)
    got = {}
    s.attach(0), s.attach(1)
    for _ in range(40):  # consumer 1 takes one batch for every five of consumer 0's
        _drive(s, [(0, 5), (1, 1)], got)
    assert s.evictions > 0 and s.again["evicted"] > 0
    for cid in (0, 1):
        for e, samples in got[cid].items():
            assert len(samples) == len(set(samples))  # never twice in an epoch
        done = [e for e in got[cid] if len(got[cid][e]) == 200]
        assert all(sorted(got[cid][e]) == list(range(200)) for e in done)
    assert [e for e in got[1] if len(got[1][e]) == 200], "the slow consumer finished an epoch"


def test_a_consumer_that_leaves_frees_its_share():
    s = Scheduler(50, slots=30, batch=5, seed=0)
    got = {}
    s.attach(0), s.attach(1)
    _drive(s, [(0, 3)], got)
    s.take(1)  # consumer 1 holds a batch and leaves without releasing it
    s.detach(1)
    assert not any(1 in p for p in s.pending)
    assert s.held.sum() == 0
    assert (s.count <= 1).all()
    _drive(s, [(0, 20)], got)
    assert sorted(got[0][0]) == list(range(50))


def test_a_sample_that_fails_leaves_the_epoch():
    s = Scheduler(10, slots=10, batch=5, seed=0)
    s.attach(0)
    jobs = s.plan(0, s.wanted(0, 0))
    bad = s.failed_one(jobs[0][1])
    for _, slot in jobs[1:]:
        s.made_one(slot)
    got = {}
    _drive(s, [(0, 2)], got)
    assert sorted(got[0][0]) == sorted(set(range(10)) - {bad})


def test_a_consumer_never_takes_the_same_copy_twice_even_where_the_pool_keeps_it():
    s = Scheduler(40, slots=200, batch=8, seed=0)  # the pool could keep the whole epoch
    s.attach(0)
    got = {}
    _drive(s, [(0, 5 * 3)], got, ahead=0)
    assert 3 * 40 <= s.made <= 3 * 40 + 8  # each epoch fresh copies (augmentations), and the next batch made


def test_staggered_consumers_with_room_to_keep_copies_share_nearly_n_fold():
    """The benchmark's case: 4 consumers attach a quarter of an epoch apart and train 2 epochs each
    at the same speed; with a pool that keeps what a late joiner needs, each copy serves nearly all 4."""
    s = Scheduler(64, slots=256, batch=4, seed=0)
    got, steps_per_epoch = {}, 16
    for k in range(4 * steps_per_epoch):  # a round: every consumer attached so far takes one batch
        if k % (steps_per_epoch // 4) == 0 and len(s.consumers) < 4 and k < steps_per_epoch:
            s.attach(len(s.consumers))
        for cid in list(s.consumers):
            if len(sum(got.get(cid, {}).values(), [])) < 2 * 64:
                _drive(s, [(cid, 1)], got, ahead=0)
    for cid in range(4):
        assert [sorted(got[cid][e]) for e in (0, 1)] == [list(range(64))] * 2
    assert s.given == 4 * 2 * 64 and s.given / s.made > 3.5, (s.given, s.made)


def test_a_copy_made_by_another_rank_is_adopted_only_where_needed_and_room_is_spare():
    s = Scheduler(20, slots=10, batch=2, seed=0)
    assert s.adopt(3, reserve=len(s.free)) is None  # nobody needs it and no room to spare
    cached = s.adopt(9, reserve=0)  # nobody needs it, room to spare: cached for later epochs
    s.made_one(cached)
    assert list(s.cached) == [cached]
    s.attach(0)
    s.wanted(0, 0)  # epoch 0 begins: it needs all 20
    slot = s.adopt(3, reserve=0)
    assert slot is not None and slot in s.making and s.count[3] == 0
    assert s.adopt(3, reserve=0) is None  # a copy is coming: not twice
    assert 9 in s.sample_in[list(s.consumers[0].ready)]  # the cached copy serves its epoch 0
    assert s.adopt(4, reserve=len(s.free)) is None  # only spare room, and nothing cached to let go
    s.made_one(slot)
    assert sorted(s.take(0).samples) == [3, 9]  # both copies made elsewhere, in its epoch 0


def test_a_sample_that_failed_on_another_rank_leaves_every_epoch():
    s = Scheduler(6, slots=12, batch=2, seed=0)
    s.attach(0)
    s.wanted(0, 0)  # epoch 0 begins, nothing made yet
    s.drop(5)
    got = {}
    _drive(s, [(0, 6)], got)
    assert all(5 not in samples for samples in got[0].values())
    assert all(sorted(got[0][e]) == [0, 1, 2, 3, 4] for e in got[0] if len(got[0][e]) == 5) and len(got[0]) > 1

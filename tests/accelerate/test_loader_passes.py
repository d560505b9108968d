"""Every ``iter()`` of the prepared train loader starts an epoch, as PyTorch's and Accelerate's do."""

import torch
from torch.utils.data import DataLoader

from epochal.accelerate.prepare_data import PreparedDataLoader


def _collate(xs):
    return {"x": torch.tensor(xs)}


def _plain(data, shuffle=False, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(data, batch_size=2, shuffle=shuffle, collate_fn=_collate, generator=generator)


def _prepared(data, shuffle=False, dp=(0, 1)):
    return PreparedDataLoader(
        _plain(data, shuffle),
        micro_batch_size=2,
        num_microbatches=1,
        dp_rank=dp[0],
        dp_size=dp[1],
        seed=5,
        train=True,
        device=torch.device("cpu"),
    )


def _take(loader, n=None):
    out = []
    for batch in loader:
        out.append(batch["x"].tolist())
        if n is not None and len(out) == n:
            break
    return out


def test_a_peek_before_the_loop_loses_no_batch_as_plain_pytorch():
    data = list(range(10))
    plain, ours = _plain(data), _prepared(data)
    assert next(iter(ours))["x"].tolist() == next(iter(plain))["x"].tolist()
    assert _take(ours) == _take(plain) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert ours.consumed_samples == 10 and ours.epoch == 1


def test_a_loop_left_early_starts_its_epoch_over():
    data = list(range(10))
    plain, ours = _plain(data), _prepared(data)
    assert _take(ours, 2) == _take(plain, 2) == [[0, 1], [2, 3]]
    assert ours.consumed_samples == 4  # what was trained so far (save_state stores it)
    assert _take(ours) == _take(plain)  # the next for starts at sample 0, as PyTorch
    # shuffled: the pass after an abandoned one repeats its epoch's order (Accelerate's
    # seedable sampler advances its epoch only at the end of a pass), a whole pass moves on
    shuffled = _prepared(list(range(12)), shuffle=True)
    first = _take(shuffled, 1)
    epoch0 = _take(shuffled)
    assert epoch0[:1] == first and len(epoch0) == 6
    assert sorted(x for b in epoch0 for x in b) == list(range(12))
    epoch1 = _take(shuffled)
    assert epoch1 != epoch0 and shuffled.consumed_samples == 24


def test_the_first_pass_after_load_state_resumes_at_the_exact_sample():
    data = list(range(12))
    ours = _prepared(data, shuffle=True)
    uninterrupted = _take(ours) + _take(ours)
    resumed = _prepared(data, shuffle=True)
    resumed.load_state_dict({"consumed_samples": 8, "mode": "train"})
    assert resumed.peek()["x"].tolist() == uninterrupted[4]  # peeking moves nothing
    assert _take(resumed, 1) == uninterrupted[4:5]
    # left early: the resumed epoch starts over at its first sample, then the epochs follow
    assert _take(resumed) == uninterrupted[:6]
    assert _take(resumed) == uninterrupted[6:]
    # the state saved mid-pass resumes there; data-parallel ranks agree with one process
    ranks = [_prepared(data, shuffle=True, dp=(r, 2)) for r in (0, 1)]
    for r in ranks:
        r.load_state_dict({"consumed_samples": 4, "mode": "train"})
    halves = [_take(r, 2) for r in ranks]
    assert [a + b for a, b in zip(*halves)] == [
        uninterrupted[2] + uninterrupted[3],
        uninterrupted[4] + uninterrupted[5],
    ]


class _Batched(torch.utils.data.Dataset):
    """A dataset with ``__getitems__`` (as Hugging Face ``datasets`` has) that records its calls."""

    def __init__(self, n):
        self.n, self.calls = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls.append(("item", i))
        return i

    def __getitems__(self, indices):
        self.calls.append(("items", list(indices)))
        return list(indices)


def test_a_micro_batch_is_read_at_once_in_the_permuted_order_of_single_reads():
    from epochal.data import permute

    n = 12
    batched = _Batched(n)
    ours = _prepared(batched, shuffle=True)
    epochs = [_take(ours) for _ in range(2)]
    # one __getitems__ call per micro-batch (as the user's DataLoader reads it), none per item
    assert batched.calls and all(kind == "items" for kind, _ in batched.calls)
    assert len(batched.calls) == 2 * n // 2
    # the same samples, in the same order, as the per-sample permutation gives
    positions = ours._positions
    expected = [
        [permute(p % n, n, (5 * 1_000_003 + p // n) % 2**64) for p in range(s, s + 2)]
        for s in range(0, 2 * n, 2)
    ]
    assert [b for e in epochs for b in e] == expected
    assert [positions.index(p) for p in range(2 * n)] == [x for b in expected for x in b]
    assert epochs[0] != epochs[1]  # a fresh permutation each epoch

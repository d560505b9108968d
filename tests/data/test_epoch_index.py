"""Tests of the EpochIndex key and the dataset protocols."""

import pickle

from epochal.data import (
    EpochIndex,
    IdentityMultiEpochDatasetWrapper,
    MultiEpochDataset,
    SizedDataset,
)


def test_epoch_index_is_a_named_tuple():
    key = EpochIndex(epoch=2, idx=5)
    assert key == (2, 5)
    assert key.epoch == 2 and key.idx == 5
    epoch, idx = key
    assert (epoch, idx) == (2, 5)
    assert pickle.loads(pickle.dumps(key)) == key
    assert hash(key) == hash((2, 5))


def test_protocols_are_structural():
    assert isinstance([1, 2, 3], SizedDataset)
    wrapped = IdentityMultiEpochDatasetWrapper([1, 2, 3])
    assert isinstance(wrapped, MultiEpochDataset)
    assert not isinstance(3, SizedDataset)

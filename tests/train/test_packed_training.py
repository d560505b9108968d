"""data.pack_sequences: a BERT / ESM run on packed micro-batches has the padded run's losses."""

from __future__ import annotations

import pytest

from epochal.model import ConfigError
from tests.parallel import bert_worker as W

PACK = ["--data.pack_sequences=true"]


@pytest.mark.parametrize(
    "shared",
    [
        pytest.param([], id="bert"),
        pytest.param(W.PAIRS, id="bert-pairs"),
        pytest.param(W.ESM, id="esm"),
    ],
)
def test_packed_run_equals_padded_run(shared, tmp_path):
    padded = W.single(str(tmp_path / "padded"), shared, variable=True)
    packed = W.single(str(tmp_path / "packed"), [*shared, *PACK], variable=True)
    assert packed["losses"] == pytest.approx(padded["losses"], abs=1e-5)
    assert packed["eval"] == pytest.approx(padded["eval"], abs=1e-5)
    assert set(packed["logged"]) == set(padded["logged"])
    for key, value in padded["logged"].items():
        assert packed["logged"][key] == pytest.approx(value, abs=1e-5), key
    assert packed["losses"] != pytest.approx(W.single(str(tmp_path / "fixed"), shared)["losses"])


def test_the_packed_micro_batches_hold_the_real_tokens_only(tmp_path):
    from epochal.data.loading.packing import pack_padded_batch

    cfg = W.config(str(tmp_path), [*W.PAIRS, *PACK])
    batch = next(iter(W.data(cfg, variable=True).train_loader))
    packed = pack_padded_batch(batch)
    real = int(batch["padding_mask"].sum())
    ids = "text"  # the pairs give their ids under Megatron's key
    assert real < batch[ids].numel() and packed[ids].shape == (1, real)
    assert packed["cu_seqlens"].tolist()[-1] == real


def test_pack_sequences_is_refused_where_it_does_not_apply(tmp_path):
    with pytest.raises(ConfigError, match="data.pack_sequences.*model.type='gpt'"):
        W.config(str(tmp_path), [*PACK, "--model.type=gpt"])
    with pytest.raises(ConfigError, match="data.pack_sequences.*pipeline"):
        W.config(str(tmp_path), [*PACK, "--parallel.pipeline_parallel=2"])
    with pytest.raises(ConfigError, match="data.pack_sequences.*binary_head.*context paral"):
        W.config(str(tmp_path), [*W.PAIRS, *PACK, "--parallel.context_parallel=2"])

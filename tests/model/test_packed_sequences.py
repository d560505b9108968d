"""Packed sequences (THD): packed forward, loss and gradients equal the padded batch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from epochal.data.loading.packing import pack_padded_batch
from epochal.model import build_model
from epochal.model.layers.attention import Attention
from epochal.model.layers.packing import PackedSequences, packed_attention
from tests.model.test_bert_model import bert_cfg, esm_cfg

LENGTHS = (32, 7, 19, 1, 26)


def padded_batch(vocab: int, lengths=LENGTHS, s: int = 32, seed: int = 0, mask_id=None):
    """Right-padded masked-LM batch ``[b, s]`` with the BERT step's keys (ESM: ``mask_id`` set)."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    tokens = torch.randint(1, vocab, (b, s), generator=g)
    padding = (torch.arange(s)[None] < torch.tensor(lengths)[:, None]).long()
    loss_mask = (torch.rand(b, s, generator=g) < 0.3).long() * padding
    loss_mask[:, 0] = 0  # the first token ([CLS]/<cls>) is never masked
    labels = torch.where(loss_mask.bool(), torch.randint(0, vocab, (b, s), generator=g), -1)
    if mask_id is not None:  # ESM: masked positions hold the mask token
        tokens = torch.where(loss_mask.bool(), torch.full_like(tokens, mask_id), tokens)
    tokens = tokens * padding
    types = (torch.arange(s)[None] >= torch.tensor(lengths)[:, None] // 2).long() * padding
    return {
        "text": tokens,
        "types": types,
        "labels": labels,
        "loss_mask": loss_mask,
        "padding_mask": padding,
        "is_random": torch.tensor([i % 2 for i in range(b)]),
    }


def run(model, batch, packed: bool):
    kwargs = {"padding_mask": batch["padding_mask"]}
    if model.tokentype_embeddings is not None:
        kwargs["token_types"] = batch["types"]
    if packed:
        kwargs["cu_seqlens"] = batch["cu_seqlens"]
    return model(batch["text"], **kwargs)


def masked_loss(logits, batch):
    losses = F.cross_entropy(
        logits.flatten(0, 1).float(), batch["labels"].clamp(min=0).flatten(), reduction="none"
    )
    mask = batch["loss_mask"].flatten().float()
    return (losses * mask).sum() / mask.sum()


def test_packed_sequences_positions_and_validation():
    p = PackedSequences.from_cu_seqlens(torch.tensor([0, 3, 4, 8]), total=8)
    assert p.lengths == (3, 1, 4) and p.max_seqlen == 4 and p.total == 8
    assert p.position_ids().tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert p.document_ids().tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert p.starts().tolist() == [0, 3, 4]
    assert p.segment_sum(torch.arange(8)).tolist() == [3, 3, 22]
    for bad, match in [
        (torch.tensor([1, 3]), "start at 0"),
        (torch.tensor([0, 3, 3, 5]), "increase strictly"),
        (torch.tensor([0]), "at least one"),
        (torch.tensor([0.0, 2.0]), "integer"),
    ]:
        with pytest.raises(ValueError, match=match):
            PackedSequences.from_cu_seqlens(bad)
    with pytest.raises(ValueError, match="ends at 8 but the packed row has 9"):
        PackedSequences.from_cu_seqlens(torch.tensor([0, 3, 8]), total=9)


def test_packed_attention_equals_document_masked_attention():
    """Per-sequence SDPA == one dense SDPA with a block-diagonal mask == flex_attention's."""
    lengths = (5, 1, 9, 3)
    p = PackedSequences.from_cu_seqlens(torch.tensor([0, 5, 6, 15, 18]))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 18, 8, generator=g) for _ in range(3))
    out = packed_attention(q, k, v, p, scale=0.3)
    doc = p.document_ids()
    same = doc[:, None] == doc[None, :]
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=same, scale=0.3)
    torch.testing.assert_close(out, dense)
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    block = flex.create_block_mask(
        lambda b, h, qi, ki: doc[qi] == doc[ki], None, None, 18, 18, device="cpu"
    )
    with pytest.warns(UserWarning):  # eager flex: unfused, but exact
        ref = flex.flex_attention(q, k, v, block_mask=block, scale=0.3)
    torch.testing.assert_close(out, ref)
    # sequence 1 (a single token) sees only itself
    torch.testing.assert_close(out[:, :, 5], v[:, :, 5])
    assert sum(lengths) == 18


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: esm_cfg(), id="esm-rope-token-dropout"),
        pytest.param(lambda: bert_cfg(), id="bert-absolute-pre-ln"),
        pytest.param(
            lambda: bert_cfg(transformer_block_type="post_ln", bert_binary_head=True),
            id="bert-absolute-post-ln-binary-head",
        ),
        pytest.param(lambda: esm_cfg(num_query_groups=2, rotary_percent=0.5), id="esm-gqa"),
    ],
)
def test_packed_equals_padded_logits_loss_and_gradients(make):
    config = make()
    batch = padded_batch(config.vocab_size, mask_id=config.mask_token_id)
    packed = pack_padded_batch(batch)
    assert packed["text"].shape == (1, sum(LENGTHS))
    padded_model = build_model(config, seed=3)
    packed_model = build_model(config, seed=3)
    out_pad = run(padded_model, batch, packed=False)
    out_pack = run(packed_model, packed, packed=True)
    if config.bert_binary_head:
        (out_pad, bin_pad), (out_pack, bin_pack) = out_pad, out_pack
        assert bin_pack.shape == (len(LENGTHS), 2)
        torch.testing.assert_close(bin_pack, bin_pad, rtol=1e-5, atol=1e-5)
    real = batch["padding_mask"].bool()
    torch.testing.assert_close(out_pack[0], out_pad[real], rtol=1e-5, atol=1e-5)
    loss_pad, loss_pack = masked_loss(out_pad, batch), masked_loss(out_pack, packed)
    torch.testing.assert_close(loss_pack, loss_pad, rtol=1e-6, atol=1e-6)
    if config.bert_binary_head:
        loss_pad = loss_pad + F.cross_entropy(bin_pad, batch["is_random"])
        loss_pack = loss_pack + F.cross_entropy(bin_pack, packed["is_random"])
    loss_pad.backward()
    loss_pack.backward()
    grads_pad = dict(padded_model.named_parameters())
    for name, p in packed_model.named_parameters():
        torch.testing.assert_close(
            p.grad, grads_pad[name].grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize("make", [esm_cfg, bert_cfg], ids=["esm", "bert"])
def test_packing_is_not_a_padded_forward_without_masks(make):
    """The test above can fail: without per-sequence attention (or, for learned
    absolute positions, restarting positions; RoPE is shift-invariant) the logits differ."""
    config = make(max_position_embeddings=128)
    batch = padded_batch(config.vocab_size, mask_id=config.mask_token_id)
    packed = pack_padded_batch(batch)
    model = build_model(config, seed=3).eval()
    with torch.no_grad():
        ref = run(model, batch, packed=False)[batch["padding_mask"].bool()]
        one_document = model(packed["text"], padding_mask=packed["padding_mask"])[0]
        running_positions = model(
            packed["text"],
            cu_seqlens=packed["cu_seqlens"],
            position_ids=torch.arange(sum(LENGTHS))[None],
        )[0]
    assert not torch.allclose(one_document, ref, atol=1e-3)
    if config.position_embedding_type == "learned_absolute":
        assert not torch.allclose(running_positions, ref, atol=1e-3)
    else:
        torch.testing.assert_close(running_positions, ref, rtol=1e-4, atol=1e-4)


def test_padded_tail_leaves_real_tokens_alone():
    config = bert_cfg(bert_binary_head=True)
    batch = padded_batch(config.vocab_size)
    plain, tailed = pack_padded_batch(batch), pack_padded_batch(batch, pad_to_multiple_of=8)
    total = sum(LENGTHS)
    assert tailed["text"].shape[1] % 8 == 0 and tailed["text"].shape[1] > total
    assert tailed["is_random"].tolist()[-1] == -1
    model = build_model(config, seed=1).eval()
    with torch.no_grad():
        a, a_bin = run(model, plain, packed=True)
        b, b_bin = run(model, tailed, packed=True)
    torch.testing.assert_close(b[:, :total], a)
    torch.testing.assert_close(b_bin[:-1], a_bin)
    torch.testing.assert_close(masked_loss(b, tailed), masked_loss(a, plain))


def test_packed_training_mode_runs_with_dropout():
    config = esm_cfg(attention_dropout=0.1, hidden_dropout=0.1)
    packed = pack_padded_batch(padded_batch(config.vocab_size, mask_id=config.mask_token_id))
    model = build_model(config, seed=0).train()
    loss = masked_loss(run(model, packed, packed=True), packed)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_packed_input_errors():
    config = bert_cfg(max_position_embeddings=16)
    model = build_model(config, seed=0).eval()
    tokens = torch.randint(0, 60, (1, 24))
    with pytest.raises(ValueError, match="sequence length 20 exceeds"):
        model(tokens, cu_seqlens=torch.tensor([0, 4, 24]))
    model(tokens, cu_seqlens=torch.tensor([0, 12, 24]))  # T > max positions is fine
    with pytest.raises(ValueError, match="one row"):
        model(tokens.view(2, 12), cu_seqlens=torch.tensor([0, 12, 24]))
    with pytest.raises(ValueError, match="ends at 20"):
        model(tokens, cu_seqlens=torch.tensor([0, 12, 20]))
    causal = Attention(bert_cfg(type="gpt", num_tokentypes=0), mask_kind="causal")
    p = PackedSequences.from_cu_seqlens(torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="bidirectional"):
        causal(torch.randn(1, 4, 64), packed=p)
    bidir = Attention(config)
    with pytest.raises(ValueError, match="no attention_mask"):
        bidir(
            torch.randn(1, 4, 64),
            attention_mask=torch.zeros(1, 1, 1, 4, dtype=torch.bool),
            packed=p,
        )


@pytest.mark.gpu
def test_varlen_kernel_matches_per_sequence_attention_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    p = PackedSequences.from_cu_seqlens(torch.tensor([0, 100, 101, 357], device="cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, 4, 357, 64, generator=g, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )
    fused = packed_attention(q, k, v, p)
    per_sequence = packed_attention(q.float(), k.float(), v.float(), p)  # float32: no varlen
    torch.testing.assert_close(fused.float(), per_sequence, rtol=2e-2, atol=2e-2)

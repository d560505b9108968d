"""T5 under every supported parallel layout gives the single-process losses (within 1e-5).

The data is the trainer's file path (Megatron's span-corruption samples). Two model
styles: Megatron's (learned positions, LayerNorm, GELU, tied head with a bias) and
Hugging Face T5 v1.1's (relative attention bias, RMSNorm, gated GELU, untied head,
more decoder than encoder blocks), which exercises the per-head relative bias under
tensor parallelism. Context parallelism (Megatron's style: learned positions) by each
exchange: every stack cut into its own chunks, the cross-attention reading every rank's
chunks of the encoder output. Pipeline parallelism, and the relative bias under context
parallelism, are refused naming the option and saying why.
"""

from __future__ import annotations

import pytest

from epochal.model import ConfigError
from tests.dist_utils import run_gloo
from tests.parallel import t5_worker as W

pytestmark = pytest.mark.distributed

DP2 = ["--parallel.data_parallel=2"]
TP2 = ["--parallel.tensor_parallel=2"]
CP2 = ["--parallel.context_parallel=2"]
# name -> (model overrides shared with the reference, layout overrides)
# (plain TP2 is inside tp2_sp and tp2_recompute; data parallelism without sharding is
# checked bit for bit by tests/parallel/test_layout_invariance.py)
LAYOUTS = {
    "dp2_full_shard": ([], [*DP2, "--parallel.dp_sharding=full"]),
    "tp2_sp": ([], [*TP2, "--parallel.sequence_parallel=true"]),
    "tp2_recompute": ([], [*TP2, "--parallel.recompute_granularity=full"]),
    # each exchange for the self-attentions; a2a's cross-attention exchanges heads too
    "cp2_allgather": ([], [*CP2, "--parallel.context_parallel_exchange=allgather"]),
    "cp2_a2a": ([], [*CP2, "--parallel.context_parallel_exchange=a2a"]),
    "cp2_p2p_recompute": (
        [],
        [
            *CP2,
            "--parallel.context_parallel_exchange=p2p",
            "--parallel.recompute_granularity=full",
        ],
    ),
    "hf_style_tp2_sp": (W.HF_STYLE, [*TP2, "--parallel.sequence_parallel=true"]),
    "hf_style_dp2_selective": (W.HF_STYLE, [*DP2, "--parallel.recompute_granularity=selective"]),
    # groups of two blocks recomputed as one, kept within each stack (2 encoder, 3 decoder)
    "hf_style_tp2_recompute_groups": (
        W.HF_STYLE,
        [*TP2, "--parallel.recompute_granularity=full", "--parallel.recompute_num_layers=2"],
    ),
}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache = {}

    def get(shared: list[str]):
        key = tuple(shared)
        if key not in cache:
            cache[key] = W.single(str(tmp_path_factory.mktemp("single") / "run"), shared)
        return cache[key]

    return get


# recompute groups: the grouping of full recompute, also checked in one process
SLOW = {
    "hf_style_tp2_recompute_groups",
    "tp2_recompute",
    "hf_style_dp2_selective",
    "hf_style_tp2_sp",
    "cp2_allgather",  # its seams are those of the ring's cross-attention and GPT's CP2
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in LAYOUTS]
)
def test_t5_layout_equals_single_process(name, references, tmp_path):
    shared, layout = LAYOUTS[name]
    reference = references(shared)
    W.write_corpus(str(tmp_path))  # once, before the ranks start (each would write it)
    ranks = run_gloo(W.rank_main, 2, str(tmp_path / "run"), [*shared, *layout])
    for out in ranks:  # every rank reports the global numbers
        assert out["losses"] == pytest.approx(reference["losses"], abs=1e-5)
        assert out["eval"] == pytest.approx(reference["eval"], abs=1e-5)
        assert set(out["logged"]) == {"lm loss", "lm accuracy", "lm ppl"}
        for key, value in reference["logged"].items():
            assert out["logged"][key] == pytest.approx(value, rel=1e-5, abs=1e-5), key
        if reference["relative_bias"] is not None:  # every head's column, on every rank
            assert out["relative_bias"] == pytest.approx(reference["relative_bias"], abs=1e-5)


@pytest.mark.slow  # four ranks: TP2 and CP2 each run in the default tier
def test_t5_tp2_cp2_equals_single_process(references, tmp_path):
    reference = references([])
    W.write_corpus(str(tmp_path))
    layout = [*TP2, "--parallel.sequence_parallel=true", *CP2]
    for out in run_gloo(W.rank_main, 4, str(tmp_path / "run"), layout):
        assert out["losses"] == pytest.approx(reference["losses"], abs=1e-5)
        assert out["eval"] == pytest.approx(reference["eval"], abs=1e-5)


@pytest.mark.parametrize(
    ("layout", "option", "why"),
    [(["--parallel.pipeline_parallel=2"], "parallel.pipeline_parallel", "encoder-decoder")],
)
def test_pipeline_parallel_is_refused_with_the_reason(tmp_path, layout, option, why):
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.model_support import check_model_layout
    from epochal.train.config import model_config_from_section

    cfg = W.config(str(tmp_path / "run"), layout)
    model = model_config_from_section(cfg.model, vocab_size=200, seq_length=W.SEQ)
    dims = ParallelDims.from_config(cfg.parallel, 2)
    with pytest.raises(ConfigError, match=why) as err:
        check_model_layout(model, dims, sequence_parallel=cfg.parallel.sequence_parallel)
    assert err.value.option == option


def test_sequence_parallel_needs_both_lengths_divisible(tmp_path):
    from epochal.parallel.dims import ParallelDims
    from epochal.train.config import model_config_from_section

    cfg = W.config(
        str(tmp_path / "run"),
        [*TP2, "--parallel.sequence_parallel=true", "--data.seq_length_decoder=15"],
    )
    model = model_config_from_section(cfg.model, vocab_size=208, seq_length=W.SEQ)
    dims = ParallelDims.from_config(cfg.parallel, 2)
    with pytest.raises(ConfigError, match="seq_length_decoder=15") as err:
        dims.validate(
            model,
            micro_batch_size=2,
            global_batch_size=8,
            seq_length=W.SEQ,
            config=cfg.parallel,
            decoder_seq_length=15,
        )
    assert err.value.option == "parallel.sequence_parallel"


def test_context_parallel_refusals_name_the_option(tmp_path):
    from epochal.parallel.dims import ParallelDims
    from epochal.train.config import model_config_from_section

    def validate(extra, dec=W.DEC):
        cfg = W.config(str(tmp_path / "run"), [*CP2, *extra, f"--data.seq_length_decoder={dec}"])
        model = model_config_from_section(cfg.model, vocab_size=208, seq_length=W.SEQ)
        ParallelDims.from_config(cfg.parallel, 2).validate(
            model,
            micro_batch_size=2,
            global_batch_size=8,
            seq_length=W.SEQ,
            config=cfg.parallel,
            decoder_seq_length=dec,
        )

    validate([])  # Megatron's T5: learned positions
    with pytest.raises(ConfigError, match="seq_length_decoder=18 must be divisible by 4") as err:
        validate([], dec=18)
    assert err.value.option == "parallel.context_parallel"
    with pytest.raises(ConfigError, match="'relative' for T5.*learned_absolute") as err:
        validate(W.HF_STYLE)
    assert err.value.option == "parallel.context_parallel"

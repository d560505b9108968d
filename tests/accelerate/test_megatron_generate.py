"""``model.megatron_generate`` on the prepared GPT-2: Accelerate's arguments, transformers' tokens.

Peer: transformers' ``generate`` on ``accelerator.unwrap_model(model)`` (the same
trained weights), greedy and beam search, each prompt alone. Tensor- and
pipeline-parallel runs (``epochal launch``, two ranks) must give one process's tokens.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from epochal.accelerate.generation import GenerateError
from tests.accelerate.generate_worker import EOS, MASK, PROMPTS, greedy, trained
from tests.dist_utils import run_process

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def prepared():
    accelerator, model = trained()
    return model, accelerator.unwrap_model(model).eval()


def _hf(hf, prompt: list[int], new: int, **options) -> list[int]:
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=new,
        pad_token_id=EOS,
        **options,
    )
    return out[0].tolist()


def _lengths() -> list[int]:
    return MASK.sum(-1).tolist()


def test_greedy_equals_transformers_on_prompts_of_different_lengths(prepared):
    model, hf = prepared
    tokens = torch.tensor(greedy(model))
    # Megatron's buffer: 5 + 6 rounded up to a multiple of 4; every row fills it
    assert tokens.shape == (3, 12)
    for i, (row, n) in enumerate(zip(tokens.tolist(), _lengths())):
        assert row[:n] == PROMPTS[i, :n].tolist()
        assert row == _hf(hf, row[:n], 12 - n, do_sample=False, eos_token_id=None)


def test_greedy_stops_at_the_stop_token_and_pads(prepared):
    model, hf = prepared
    free = greedy(model)
    stop = free[1][3]  # a token row 1 generates at its second step
    tokens = model.megatron_generate(PROMPTS, MASK, max_new_tokens=6, top_k=1, stop_token=stop)
    width = tokens.shape[1]
    for row, n, full in zip(tokens.tolist(), _lengths(), free):
        reference = _hf(hf, full[:n], 12 - n, do_sample=False, eos_token_id=stop)
        if stop in reference[n:]:
            end = reference.index(stop, n) + 1
            assert row[:end] == reference[:end] and set(row[end:]) <= {EOS}
        else:
            assert row == reference
    ends = [r.index(stop, n) + 1 if stop in r[n:] else 12 for r, n in zip(free, _lengths())]
    assert width == max(ends)
    # the default stop token is the end-of-document id (the config's eos_token_id)
    default = model.megatron_generate(PROMPTS[:1], max_new_tokens=6, top_k=1)
    hf_default = _hf(hf, PROMPTS[0].tolist(), 7, do_sample=False, eos_token_id=EOS)
    assert default[0].tolist()[: len(hf_default)] == hf_default


def test_sampling_repeats_with_the_same_random_seed(prepared):
    model, _ = prepared
    options = dict(max_new_tokens=6, temperature=0.8, top_p=0.9, top_p_decay=0.5, top_p_bound=0.3)
    state = torch.get_rng_state()
    first = model.megatron_generate(PROMPTS, MASK, random_seed=3, **options)
    torch.manual_seed(123)  # the global RNG plays no part
    again = model.megatron_generate(PROMPTS, MASK, random_seed=3, **options)
    other = model.megatron_generate(PROMPTS, MASK, random_seed=4, **options)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    topk = [model.megatron_generate(PROMPTS, MASK, max_new_tokens=6, top_k=5) for _ in range(2)]
    assert torch.equal(*topk)  # random_seed defaults to 0
    assert torch.equal(first[:, :5] * MASK, PROMPTS)  # prompts are kept
    torch.set_rng_state(state)


def test_beam_search_one_beam_is_greedy_and_more_beams_are_transformers(prepared):
    model, hf = prepared
    free = greedy(model)
    for i, n in enumerate(_lengths()):
        prompt = PROMPTS[i : i + 1, :n]
        beam = model.megatron_generate(prompt, max_new_tokens=6, num_beams=1, stop_token=None)
        one = model.megatron_generate(prompt, max_new_tokens=6, top_k=1, stop_token=None)
        width = 4 * -(-(n + 6) // 4)  # alone, the buffer is the prompt's own
        assert beam.tolist() == one.tolist() == [free[i][:width]]
    prompt = PROMPTS[:1]
    beams = model.megatron_generate(prompt, max_new_tokens=6, num_beams=3, length_penalty=0.5)
    peer = _hf(
        hf,
        prompt[0].tolist(),
        7,
        num_beams=3,
        length_penalty=0.5,
        eos_token_id=EOS,
        do_sample=False,
    )
    assert beams.shape == (1, 12)
    assert beams[0].tolist()[: len(peer)] == peer
    assert set(beams[0].tolist()[len(peer) :]) <= {EOS}


def test_add_bos_prepends_the_end_of_document_id(prepared):
    model, hf = prepared
    tokens = model.megatron_generate(
        PROMPTS, MASK, max_new_tokens=6, top_k=1, add_BOS=True, stop_token=None
    )
    assert tokens.shape == (3, 12)  # 5 + 1 + 6
    for row, n in zip(tokens.tolist(), _lengths()):
        assert row[0] == EOS
        assert row == _hf(hf, row[: n + 1], 11 - n, do_sample=False, eos_token_id=None)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(max_new_tokens=4, num_beams=2), "one prompt"),
        (dict(max_new_tokens=4, top_k=5, top_p=0.5), "top_p and top_k"),
        (dict(), "max_length or max_new_tokens"),
        (dict(max_new_tokens=4, temperature=0.0), "temperature"),
        (dict(max_new_tokens=4, top_p_decay=1.5), "top_p_decay"),
        (dict(max_new_tokens=4, add_BOS=1), "add_BOS"),
        (dict(max_new_tokens=4, top_p_dcay=0.5), "unknown keyword"),
        (dict(max_new_tokens=40), "positions"),
        (dict(max_length=5), "max_new_tokens"),
    ],
)
def test_bad_arguments_are_named(prepared, kwargs, match):
    model, _ = prepared
    with pytest.raises(GenerateError, match=match):
        model.megatron_generate(PROMPTS, MASK, **kwargs)


def test_left_padded_prompts_are_refused(prepared):
    model, _ = prepared
    with pytest.raises(GenerateError, match="right-padded"):
        model.megatron_generate(PROMPTS, MASK.flip(-1), max_new_tokens=4)


TP2_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: MEGATRON_LM
machine_rank: 0
main_training_function: main
megatron_lm_config:
  megatron_lm_tp_degree: 2
mixed_precision: 'no'
num_machines: 1
num_processes: 2
use_cpu: true
"""


@pytest.mark.distributed
@pytest.mark.slow  # two launches; tests/model/test_generation_tp.py covers TP2 generation
def test_tp2_and_pp2_give_one_process_tokens_and_dp2_is_refused(prepared, tmp_path):
    model, _ = prepared
    reference = greedy(model)
    (tmp_path / "tp2.yaml").write_text(TP2_YAML)
    cmd = [
        sys.executable,
        "-m",
        "epochal.cli",
        "launch",
        "--config_file",
        str(tmp_path / "tp2.yaml"),
        str(HERE / "generate_worker.py"),
        str(tmp_path),
    ]
    proc = run_process(
        cmd, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=str(tmp_path)
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    for layout in ("tp2", "pp2"):
        for rank in (0, 1):
            assert json.loads((tmp_path / f"{layout}_rank{rank}.json").read_text()) == reference, (
                layout
            )
    for rank in (0, 1):
        error = json.loads((tmp_path / f"dp2_rank{rank}.json").read_text())
        assert error is not None and "data-parallel size 1" in error


def test_vocab_file_gives_the_end_of_document_id(prepared, tmp_path):
    """``other_megatron_args["vocab_file"]``: its ``<|endoftext|>`` is the default stop token."""
    from epochal.accelerate.utils import MegatronLMPlugin

    model, hf = prepared
    stop = greedy(model)[0][6]
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"a": 0, "<|endoftext|>": stop}))
    MegatronLMPlugin(other_megatron_args={"vocab_file": str(vocab), "merge_file": "merges.txt"})
    model.vocab_file = str(vocab)
    try:
        tokens = model.megatron_generate(PROMPTS[:1], max_new_tokens=6, top_k=1)
        (tmp_path / "bad.json").write_text("{}")
        model.vocab_file = str(tmp_path / "bad.json")
        with pytest.raises(GenerateError, match="vocab_file"):
            model.megatron_generate(PROMPTS[:1], max_new_tokens=6, top_k=1)
    finally:
        model.vocab_file = None
    peer = _hf(hf, PROMPTS[0].tolist(), 7, do_sample=False, eos_token_id=stop)
    assert tokens[0].tolist() == peer and peer[-1] == stop

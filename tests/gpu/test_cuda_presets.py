"""On CUDA (marked ``gpu``; skipped without it): the tiny presets train, resume, generate, fill masks.

Each preset trains a few steps on the GPU in bfloat16 with compiled blocks, once
straight through and once stopped half-way and resumed: the losses of the steps
after the resume equal the uninterrupted run's bit for bit (same GPU, same kernels).
Then the run generates (``tiny``, ``t5-tiny``) or fills masks (``bert-tiny``) on the
GPU, and a model exported to Hugging Face format and read back on the GPU gives the
same logits as transformers' ``LlamaForCausalLM`` there.

The CPU twins of these tests are ``tests/train/test_cli_train.py``,
``tests/train/test_bert_training.py``, ``tests/train/test_t5_training.py`` and
``tests/convert/test_convert_hf.py``; ``tests/model/test_build_device.py`` checks
that the CUDA-built weights are the CPU ones.
"""

from __future__ import annotations

import pytest
import torch

from epochal.train.observe.metrics import read_metrics
from tests.train.synthetic import write_prose_jsonl

pytestmark = pytest.mark.gpu

CUDA_FAST = [
    "--training.device=cuda",
    "--training.bf16=true",
    "--training.compile=true",
    "--model.hidden_size=64",
    "--model.num_layers=2",
    "--model.ffn_hidden_size=128",
    "--training.global_batch_size=8",
    "--training.eval_interval=2",
    "--training.eval_iters=1",
    "--scheduler.lr_warmup_iters=1",
    "--scheduler.lr_decay_iters=4",
    "--checkpoint.save_interval=2",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]

PRESETS = {
    "tiny": ["--data.corpus_max_bytes=300000", "--data.split=90,10,0", "--data.seq_length=64"],
    "bert-tiny": ["--data.wordpiece_vocab_size=1000", "--data.seq_length=64"],
    "t5-tiny": [
        "--data.wordpiece_vocab_size=1000",
        "--data.seq_length=64",
        "--data.seq_length_decoder=24",
    ],
}


def _losses(run):
    return {
        r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"
    }


@pytest.mark.parametrize("preset", list(PRESETS))
def test_tiny_preset_on_cuda_resumes_bit_exactly_and_serves(preset, tmp_path, monkeypatch, capsys):
    from epochal.cli import main

    monkeypatch.setenv("EPOCHAL_CACHE", str(tmp_path / "cache"))
    corpus = (
        [] if preset == "tiny" else [f"--data.corpus={write_prose_jsonl(tmp_path / 'p.jsonl')}"]
    )
    args = [f"--preset={preset}", *CUDA_FAST, *PRESETS[preset], *corpus]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert main(["train", *args, f"--run_dir={full}", "--training.train_iters=4"]) == 0
    out = capsys.readouterr().out
    assert "on NVIDIA" in out and "bf16" in out  # the summary names the GPU and the dtype
    assert main(["train", *args, f"--run_dir={parts}", "--training.train_iters=2"]) == 0
    assert main(["train", *args, f"--run_dir={parts}", "--training.train_iters=4"]) == 0
    assert _losses(parts) == _losses(full)  # steps 3-4 after the resume, bit for bit
    records = [r for r in read_metrics(full / "metrics.jsonl") if r["kind"] == "train"]
    assert all(r["mem_peak_allocated_gib"] > 0 and "mem_peak_reserved_pct" in r for r in records)
    capsys.readouterr()
    if preset == "bert-tiny":
        cmd = ["fill-mask", "--checkpoint", str(full), "--text", "the [MASK] sat", "--device=cuda"]
        assert main(cmd) == 0
        assert "[MASK] 0:" in capsys.readouterr().out
    else:
        prompt = "def " if preset == "tiny" else "the cat"
        cmd = ["generate", "--checkpoint", str(full), "--prompt", prompt, "--max-new-tokens", "8"]
        cmd.append("--device=cuda")
        assert main(cmd) == 0
        assert capsys.readouterr().out.strip()


def test_hf_llama_round_trip_on_cuda(tmp_path):
    transformers = pytest.importorskip("transformers")
    from epochal.formats.hf.io import load_hf_checkpoint, save_hf_checkpoint
    from epochal.model import GPTModel
    from tests.convert.hf_models import llama_like

    with torch.device("cuda"):
        model = GPTModel(llama_like(), seed=3).eval()
    save_hf_checkpoint(model.config, model.state_dict(), tmp_path / "hf", eos_token_id=1)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").cuda().eval()
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        ours, theirs = model(tokens)[..., :100], hf(tokens).logits[..., :100]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    back = load_hf_checkpoint(tmp_path / "hf")
    vocab = model.config.vocab_size  # HF keeps the real rows; padded ones come back zero
    for name, tensor in model.state_dict().items():
        rows = vocab if tensor.shape[0] == model.config.padded_vocab_size else tensor.shape[0]
        assert torch.equal(back.state[name][:rows].cuda(), tensor[:rows]), name

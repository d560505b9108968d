"""Megatron ``torch_dist`` and NeMo 2 conversion: time and peak memory against the legacy path.

A random GPT-2-small-sized model (12 x 768, 50257 ids, 1024 positions, 124M
parameters, fp32) is written as a Megatron legacy checkpoint (TP1) and as a
``torch_dist`` folder (``epochal convert --to megatron --ckpt-format torch_dist``);
the ``torch_dist`` folder, with its tensors renamed under ``module.`` and a
``context/model.yaml``, is also a NeMo 2 checkpoint. Each row runs
``epochal convert`` in a fresh process and reports its wall time and peak resident
memory (``ru_maxrss``), minus that of a process that only imports torch and epochal
(measured the same way), next to the size of the checkpoint on disk. Run::

    python benchmarks/bench_convert_dist.py       # ~1-2 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    import torch
    import epochal.cli
    argv = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    rc = epochal.cli.main(argv) if argv else 0
    dt = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rc": rc, "seconds": dt, "peak_mb": peak_mb}))
    """
)


def run_child(argv: list[str]) -> dict:
    """``epochal`` with ``argv`` in a fresh process: ``{"rc", "seconds", "peak_mb"}``."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argv)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["rc"] != 0:
        raise SystemExit(f"epochal {' '.join(argv)} failed:\n{proc.stderr}")
    return result


def size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def make_nemo2(torch_dist: Path, out: Path) -> None:
    """A NeMo 2 folder from a torch_dist iteration: tensors under ``module.``, a model.yaml."""
    import torch
    from torch.distributed.checkpoint import FileSystemWriter, save

    from epochal.convert.megatron.torch_dist import read_torch_dist, stack_layers

    tensors, _ = read_torch_dist(torch_dist)
    state = {f"module.{k}": v.contiguous() for k, v in stack_layers(tensors).items()}
    (out / "weights").mkdir(parents=True)
    save(state, storage_writer=FileSystemWriter(str(out / "weights")), no_dist=True)
    (out / "weights" / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    torch.save({}, out / "weights" / "common.pt")
    (out / "context").mkdir()
    (out / "context" / "model.yaml").write_text(
        textwrap.dedent(
            """\
            _target_: nemo.collections.llm.gpt.model.base.GPTModel
            config:
              _target_: nemo.collections.llm.gpt.model.base.GPTConfig
              num_layers: 12
              hidden_size: 768
              ffn_hidden_size: 3072
              num_attention_heads: 12
              normalization: LayerNorm
              layernorm_epsilon: 1.0e-05
              position_embedding_type: learned_absolute
              seq_length: 1024
              vocab_size: 50257
            """
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()

    from epochal.model import ModelConfig, build_model
    from epochal.train.state.epochal_ckpt import save_epochal_checkpoint

    config = ModelConfig(
        vocab_size=50257,
        hidden_size=768,
        num_layers=12,
        num_attention_heads=12,
        ffn_hidden_size=3072,
        max_position_embeddings=1024,
        position_embedding_type="learned_absolute",
        normalization="LayerNorm",
        activation="gelu",
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_model(config, seed=0)
        params = sum(p.numel() for p in model.parameters())
        save_epochal_checkpoint(config, model.state_dict(), root / "ours", source="bench")
        del model
        base = run_child([])
        rows = []

        def row(name: str, argv: list[str], checkpoint: Path) -> None:
            r = run_child(argv)
            rows.append((name, size_mb(checkpoint), r["seconds"], r["peak_mb"], base["peak_mb"]))

        row(
            "epochal -> Megatron legacy (TP1)",
            ["convert", str(root / "ours"), str(root / "legacy"), "--to", "megatron"],
            root / "ours",
        )
        row(
            "epochal -> Megatron torch_dist",
            [
                "convert",
                str(root / "ours"),
                str(root / "dist"),
                "--to",
                "megatron",
                "--ckpt-format",
                "torch_dist",
            ],
            root / "ours",
        )
        row(
            "Megatron legacy (TP1) -> epochal",
            ["convert", str(root / "legacy"), str(root / "from_legacy"), "--to", "epochal"],
            root / "legacy",
        )
        row(
            "Megatron torch_dist -> epochal",
            ["convert", str(root / "dist"), str(root / "from_dist"), "--to", "epochal"],
            root / "dist",
        )
        make_nemo2(root / "dist" / "iter_0000000", root / "nemo")
        row(
            "NeMo 2 -> epochal",
            ["convert", str(root / "nemo"), str(root / "from_nemo"), "--to", "epochal"],
            root / "nemo",
        )
        row(
            "Megatron torch_dist -> Hugging Face",
            ["convert", str(root / "dist"), str(root / "hf"), "--to", "hf"],
            root / "dist",
        )

    print(
        f"GPT-2-small-sized model: {params / 1e6:.1f}M parameters, fp32; "
        f"import-only process: {base['peak_mb']:.0f} MB peak RSS (subtracted)"
    )
    print()
    print(
        "| conversion                          | input on disk (MB) | time (s) "
        "| peak RSS (MB) | above import (MB) | above import / input |"
    )
    print(
        "|-------------------------------------|--------------------|----------"
        "|---------------|-------------------|----------------------|"
    )
    for name, mb, seconds, peak, base_mb in rows:
        above = peak - base_mb
        print(
            f"| {name:<35} | {mb:18.0f} | {seconds:8.2f} | {peak:13.0f} | {above:17.0f} "
            f"| {above / mb:19.2f}x |"
        )


if __name__ == "__main__":
    main()

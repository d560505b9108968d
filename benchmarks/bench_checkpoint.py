"""Checkpoint write and read times with and without checksums (issue 15, item 2).

Saves and loads one training checkpoint of a GPT-2-small-sized model (124M
parameters, fp32, with AdamW's two moments: about 1.5 GB on disk) through
:class:`epochal.train.state.checkpoint.Checkpointer`, once with ``checksums=False``
(no ``manifest.json``, no verification: the cost before issue 15) and once with
checksums (SHA-256 of every file written last, verified on load), alternating,
median of ``--repeats``. Also times the consolidated ``.safetensors`` export of
the model (sealing its embedded SHA-256, then verifying it), and the raw hash
throughput of SHA-256, BLAKE2b and CRC32 on the same machine, which is why
SHA-256 was chosen.

The files stay in the page cache between writing and reading (what a resume
right after a save, or a verify right after a write, sees); on a cold cache the
read is disk-bound and the hash adds proportionally less.

    python benchmarks/bench_checkpoint.py                 # GPT-2 small, 3 repeats
    python benchmarks/bench_checkpoint.py --hidden 256 --layers 2 --repeats 1   # quick
    python benchmarks/bench_checkpoint.py --clock cpu     # process CPU time: a busy, shared machine
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
import warnings
import zlib
from pathlib import Path

import torch

from epochal._checksum import seal_safetensors, verify_safetensors
from epochal.model import GPTModel, ModelConfig
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.model_state import ModelState

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def build(args: argparse.Namespace) -> tuple[GPTModel, OptimizersContainer]:
    config = ModelConfig(
        vocab_size=50257,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        max_position_embeddings=1024,
        position_embedding_type="learned_absolute",
    )
    model = GPTModel(config, seed=0)
    opt = OptimizersContainer([model], lambda p: build_adamw([p], lr=1e-4, weight_decay=0.1))
    model(torch.arange(8)[None]).float().mean().backward()  # create AdamW's moments
    opt.step()
    return model, opt


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def time_save_load(
    root: Path, checksums: bool, model: GPTModel, opt: OptimizersContainer, clock=time.perf_counter
) -> tuple[float, float, int]:
    ck = Checkpointer(root / ("with" if checksums else "without"), checksums=checksums)
    state = {"model": ModelState([model]), "optimizer": opt}
    t0 = clock()
    folder = ck.save(1, state, trainer_state={"step": 1}, rng_state={"x": torch.zeros(1)})
    t_save = clock() - t0
    reader = Checkpointer(ck.directory, checksums=checksums)  # a fresh process's view
    t0 = clock()
    reader.load(folder, state)
    t_load = clock() - t0
    size = folder_bytes(folder)
    shutil.rmtree(ck.directory)
    return t_save, t_load, size


def time_export(
    root: Path, model: GPTModel, clock=time.perf_counter
) -> tuple[float, float, float, float, int]:
    from safetensors.torch import load_file, save_file

    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "output.weight"}
    path = root / "model.safetensors"
    t0 = clock()
    save_file(tensors, str(path), metadata={"epochal_sha256": "0" * 64})
    t_write = clock() - t0
    t0 = clock()
    seal_safetensors(path)
    t_seal = clock() - t0
    t0 = clock()
    load_file(str(path))
    t_read = clock() - t0
    t0 = clock()
    assert verify_safetensors(path)
    t_verify = clock() - t0
    size = path.stat().st_size
    path.unlink()
    return t_write, t_seal, t_read, t_verify, size


def hash_rates(mb: int = 256, clock=time.perf_counter) -> dict[str, float]:
    data = os.urandom(mb << 20)
    rates = {}
    for name, fn in (
        ("sha256", lambda b: hashlib.sha256(b).digest()),
        ("blake2b", lambda b: hashlib.blake2b(b).digest()),
        ("crc32 (zlib)", zlib.crc32),
    ):
        t0 = clock()
        fn(data)
        rates[name] = mb / 1024 / (clock() - t0)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall", help="wall time or process CPU time"
    )
    args = parser.parse_args()
    clock = CLOCKS[args.clock]
    warnings.filterwarnings("ignore", message=".*assuming the intent is to .* single process.*")
    model, opt = build(args)
    params = sum(p.numel() for p in model.parameters())
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    size = 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        for _ in range(args.repeats):
            for checksums in (False, True):
                t_save, t_load, size = time_save_load(root, checksums, model, opt, clock)
                times[checksums].append((t_save, t_load))
        export = [time_export(root, model, clock) for _ in range(args.repeats)]
    gb = size / 1e9
    print(
        f"model: {params / 1e6:.1f}M parameters (h{args.hidden} L{args.layers}, fp32 + AdamW); "
        f"checkpoint {gb:.2f} GB; median of {args.repeats}; {args.clock} clock"
    )
    print("| what | without checksums | with checksums | cost |")
    print("|---|---|---|---|")
    for i, what in enumerate(("save (Checkpointer.save)", "load (Checkpointer.load)")):
        off = statistics.median(t[i] for t in times[False])
        on = statistics.median(t[i] for t in times[True])
        print(
            f"| {what} | {off:.2f} s | {on:.2f} s | +{on - off:.2f} s (+{(on / off - 1) * 100:.0f}%) |"
        )
    med = [statistics.median(e[i] for e in export) for i in range(4)]
    esize = export[0][4] / 1e9
    print(
        f"| safetensors export write ({esize:.2f} GB) | {med[0]:.2f} s | {med[0] + med[1]:.2f} s | "
        f"+{med[1]:.2f} s |"
    )
    print(
        f"| safetensors export read (memory-mapped) | {med[2]:.2f} s | {med[2] + med[3]:.2f} s | "
        f"+{med[3]:.2f} s |"
    )
    rates = hash_rates(clock=clock)
    print(
        f"hash throughput (one core, in memory, {args.clock} clock): "
        + ", ".join(f"{k} {v:.2f} GB/s" for k, v in rates.items())
    )


if __name__ == "__main__":
    main()

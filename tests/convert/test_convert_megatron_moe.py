"""Peer tests: Megatron-Core mixture-of-experts GPTModels (local spec, CPU) <-> epochal.

One worker process (:mod:`tests.convert.mcore_moe_worker`) builds Megatron-Core's own MoE
``GPTModel`` (4 experts top-2, SwiGLU; with a gated shared expert, and without one with
a dense second block; and with DeepSeek-V3's routing: sigmoid scores, a balancing bias,
group-limited, scaled) and saves it with ``dist_checkpointing`` and as a legacy rank file;
epochal reads both with Megatron's logits. epochal's exports (``torch_dist`` and legacy)
load into fresh Megatron-Core models with the same logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from epochal.convert.megatron.legacy import load_megatron_checkpoint, save_megatron_checkpoint
from epochal.formats.common import ConversionError
from epochal.model import build_model
from tests.convert import mcore_moe_worker
from tests.convert.mcore_moe_worker import VARIANTS, our_config
from tests.dist_utils import run_gloo

pytestmark = [pytest.mark.peer, pytest.mark.distributed]
pytest.importorskip("megatron.core")
pytest.importorskip("psutil")


def _run_worker(out: Path, load: Path | None = None) -> torch.Tensor:
    out.mkdir(parents=True, exist_ok=True)
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, out / "tokens.pt")
    run_gloo(mcore_moe_worker.gloo_rank, 1, str(out), str(load or ""), timeout=300)
    return tokens


@pytest.fixture(scope="module")
def megatron_saved(tmp_path_factory) -> tuple[Path, torch.Tensor]:
    out = tmp_path_factory.mktemp("mcore_moe")
    return out, _run_worker(out)


def _ours(ck) -> torch.nn.Module:
    model = build_model(ck.config).eval()
    model.load_state_dict(ck.state, strict=True)
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_megatron_core_moe_checkpoints_import_with_its_logits(tmp_path, megatron_saved, variant):
    """torch_dist (experts stacked [E, ...]) and legacy files of Megatron-Core's MoE GPTModel,
    and the same weights re-split over two expert-parallel ranks (and TP2), give its logits."""
    root, tokens = megatron_saved
    reference = torch.load(root / variant / "logits.pt")[..., :100]
    assert reference.abs().max() > 1.0
    for fmt in ("dist", "legacy"):
        ck = load_megatron_checkpoint(root / variant / fmt)
        assert ck.config == our_config(variant) and ck.iteration == 7
        with torch.no_grad():
            ours = _ours(ck)(tokens)[..., :100]
        torch.testing.assert_close(ours, reference, atol=1e-4, rtol=0)
    # an expert-parallel layout: mp_rank_{tp}_{ep} folders, each with its local experts
    out = save_megatron_checkpoint(
        ck.config, ck.state, tmp_path / "ep2", tensor_parallel=2, expert_parallel=2, spec="local"
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "mp_rank_00_000",
        "mp_rank_00_001",
        "mp_rank_01_000",
        "mp_rank_01_001",
    ]
    rank1 = torch.load(out / "mp_rank_00_001" / "model_optim_rng.pt", weights_only=False)
    experts = {k.split(".")[6] for k in rank1["model"] if ".local_experts." in k}
    assert experts == {"0", "1"} and rank1["args"].expert_model_parallel_size == 2
    back = load_megatron_checkpoint(tmp_path / "ep2")
    with torch.no_grad():
        torch.testing.assert_close(_ours(back)(tokens)[..., :100], reference, atol=1e-4, rtol=0)


def test_megatron_core_grouped_experts_import_with_its_logits(megatron_saved):
    """GroupedMLP's legacy tensors (``weight1`` / ``weight2``, filled by Megatron's own
    dist_checkpointing from the sequential model) give the sequential model's logits."""
    root, tokens = megatron_saved
    ck = load_megatron_checkpoint(root / "grouped" / "iter_0000007")
    payload = torch.load(
        root / "grouped" / "iter_0000007" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False
    )
    assert "decoder.layers.0.mlp.experts.weight1" in payload["model"]
    with torch.no_grad():
        ours = _ours(ck)(tokens)[..., :100]
    reference = torch.load(root / "shared" / "logits.pt")[..., :100]
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=0)


def test_our_moe_exports_load_into_megatron_core(tmp_path):
    """epochal -> torch_dist and legacy (local spec) -> Megatron-Core's loaders: same logits."""
    models = {}
    for variant in VARIANTS:
        cfg = our_config(variant)
        model = build_model(cfg, seed=4).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
                elif "router" in name:
                    p.normal_(0.0, 0.5)  # decided routing
        models[variant] = model
        for fmt, kw in (("dist", {"ckpt_format": "torch_dist"}), ("legacy", {})):
            save_megatron_checkpoint(
                cfg, model.state_dict(), tmp_path / "mg" / variant / fmt, spec="local", **kw
            )
    tokens = _run_worker(tmp_path / "run", load=tmp_path / "mg")
    for variant, model in models.items():
        with torch.no_grad():
            ours = model(tokens)[..., :100]
        for fmt in ("dist", "legacy"):
            theirs = torch.load(tmp_path / "run" / variant / f"logits_{fmt}.pt")[..., :100]
            torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_routing_megatron_cannot_express_is_refused_by_name(tmp_path, megatron_saved):
    root, _ = megatron_saved
    folder = root / "shared" / "legacy" / "iter_0000007" / "mp_rank_00"
    payload = torch.load(folder / "model_optim_rng.pt", weights_only=False)
    for name, value in (
        ("moe_router_score_function", "sqrtsoftplus"),
        ("moe_input_jitter_eps", 0.01),
        ("moe_router_load_balancing_type", "sinkhorn"),
    ):
        bad = tmp_path / name / "iter_0000007" / "mp_rank_00"
        bad.mkdir(parents=True)
        args = type(payload["args"])(**{**vars(payload["args"]), name: value})
        torch.save({**payload, "args": args}, bad / "model_optim_rng.pt")
        with pytest.raises(ConversionError, match=f"mp_rank_00.*args.{name}={value!r}"):
            load_megatron_checkpoint(bad.parent)

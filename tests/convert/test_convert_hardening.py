"""Hostile checkpoints: nothing silent, nothing lost, nothing outside the folder opened.

Issue 26's conversion findings, each reproduced on a tiny checkpoint of the format
(:mod:`tests.convert.hostile`): silent wrong conversions (metadata larger than its
chunks, a vocabulary contradicting the embedding, a flipped byte in a legacy file,
fractional heads, negative steps), lost data (an output that is or holds the input),
escaping references, and one representative per class of malformed input (wrong type,
missing field, zero, deep nesting, alias bomb, reference bomb, huge file, huge declared
tensor, truncated shard), each refused with an error naming the file or option.
"""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path

import pytest
import torch

from epochal.convert.megatron.legacy import load_megatron_checkpoint
from epochal.formats.bounded_parse import ConfigFileError
from epochal.formats.common import ConversionError
from epochal.formats.hf.io import load_hf_checkpoint
from epochal.formats.safe_load import UnsafeCheckpointError
from epochal.train.state.checkpoint import Checkpointer, CheckpointError
from epochal.train.state.epochal_ckpt import load_epochal_checkpoint
from tests.convert import hostile

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    hostile.hf_folder(root / "hf")
    hostile.hf_folder(root / "llama", "llama")
    hostile.megatron_folder(root / "meg")
    hostile.megatron_folder(root / "meg22", tp=2, pp=2)
    hostile.megatron_folder(root / "dist", fmt="torch_dist")
    hostile.nemo_folder(root / "nemo")
    hostile.epochal_run(root / "run")
    return root


@pytest.fixture
def copy(built, tmp_path):
    def make(name: str) -> Path:
        return Path(shutil.copytree(built / name, tmp_path / name))

    return make


def _dist(folder: Path) -> Path:
    return folder / "iter_0000005"


# ------------------------------------------------------------- silent wrong conversions
def test_metadata_larger_than_its_chunks_is_refused(copy):
    """3 layers declared, chunks for 2: DCP would return uninitialized memory for layer 3."""
    folder = copy("dist")

    def grow(metadata):
        _, meta = hostile.tensor_meta(metadata, "linear_qkv.weight")
        meta.size = torch.Size([3, *meta.size[1:]])

    hostile.edit_metadata(_dist(folder), grow)
    with pytest.raises(ConversionError, match=r"linear_qkv.weight.*cover .* of the .* elements"):
        load_megatron_checkpoint(folder)


@pytest.mark.parametrize("vocab", [50, 5000])
def test_hf_vocab_size_contradicting_the_embedding_is_refused(copy, vocab):
    folder = copy("hf")
    hostile.edit_json(folder / "config.json", lambda c: c.update(vocab_size=vocab))
    with pytest.raises(
        ConversionError, match=rf"config.json: vocab_size={vocab} contradicts .*wte"
    ):
        load_hf_checkpoint(folder)


@pytest.mark.parametrize("field, value", [("vocab_size", 5000), ("padded_vocab_size", 256)])
def test_megatron_vocab_contradicting_the_embedding_is_refused(copy, field, value):
    folder = copy("meg")
    hostile.edit_rank(hostile.rank_file(folder), lambda p: setattr(p["args"], field, value))
    with pytest.raises(ConversionError, match=rf"args.{field}={value} contradicts"):
        load_megatron_checkpoint(folder)


def test_megatron_vocab_far_below_the_rows_is_refused(copy):
    """vocab 10 with 128 rows: more than Megatron's padding; rows would be cut."""
    folder = copy("meg")

    def shrink(payload):
        payload["args"].vocab_size = 10
        payload["args"].make_vocab_size_divisible_by = 16

    hostile.edit_rank(hostile.rank_file(folder), shrink)
    with pytest.raises(ConversionError, match=r"args.vocab_size=10 contradicts .* 128 rows"):
        load_megatron_checkpoint(folder)


def test_torch_dist_common_pt_vocab_contradicting_the_embedding_is_refused(copy):
    folder = copy("dist")
    common = _dist(folder) / "common.pt"
    payload = torch.load(common, weights_only=False)
    payload["args"].vocab_size = 5000
    torch.save(payload, common)
    with pytest.raises(ConversionError, match=r"args.vocab_size=5000 contradicts"):
        load_megatron_checkpoint(folder)


def test_nemo_vocab_contradicting_the_embedding_is_refused(copy):
    folder = copy("nemo")
    yaml = folder / "context" / "model.yaml"
    yaml.write_text(yaml.read_text().replace("vocab_size: 100", "vocab_size: 5000"))
    with pytest.raises(ConversionError, match=r"vocab_size=5000 contradicts"):
        load_megatron_checkpoint(folder)


def test_flipped_byte_in_a_legacy_rank_file_is_refused(copy):
    folder = copy("meg")
    path = hostile.rank_file(folder)
    data = bytearray(path.read_bytes())
    at = data.find(b"data/0") + 200  # inside the first tensor's bytes
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(UnsafeCheckpointError, match=r"model_optim_rng.pt.*CRC"):
        load_megatron_checkpoint(folder)


def test_fractional_heads_are_refused(copy):
    hf = copy("llama")
    hostile.edit_json(hf / "config.json", lambda c: c.update(num_attention_heads=4.7))
    with pytest.raises(ConversionError, match="num_attention_heads must be a positive integer"):
        load_hf_checkpoint(hf)
    meg = copy("meg")
    hostile.edit_rank(hostile.rank_file(meg), lambda p: setattr(p["args"], "num_query_groups", 2.5))
    with pytest.raises(ConversionError, match=r"args.num_query_groups must be a positive integer"):
        load_megatron_checkpoint(meg)


def test_negative_step_in_trainer_state_is_refused(copy):
    run = copy("run")
    step = next((run / "checkpoints").glob("step_*"))
    (step / "manifest.json").unlink(missing_ok=True)
    hostile.edit_json(step / "trainer_state.json", lambda s: s.update(step=-5))
    with pytest.raises(CheckpointError, match=r"trainer_state.json: step must be an integer >= 0"):
        Checkpointer(run / "checkpoints").read_trainer_state(step)
    with pytest.raises(CheckpointError, match="step must be an integer >= 0"):
        load_epochal_checkpoint(run)


# ------------------------------------------------------------------------ lost data
def _convert(*argv: str) -> int:
    from epochal.cli import main

    return main(["convert", *argv])


def test_convert_never_writes_over_or_into_its_input(copy, capsys):
    run = copy("run")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert _convert(str(run), str(run), "--to", "epochal", "--overwrite") == 2
    assert "is the input" in capsys.readouterr().err
    assert _convert(str(run), str(run / "checkpoints"), "--to", "hf", "--overwrite") == 2
    assert "inside the input" in capsys.readouterr().err
    step = next((run / "checkpoints").glob("step_*"))
    assert _convert(str(step), str(run), "--to", "epochal", "--overwrite") == 2
    assert "contains the input" in capsys.readouterr().err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_converting_into_a_megatron_save_dir_never_moves_its_tracker_back(copy, capsys):
    from epochal.convert.megatron.legacy import TRACKER_FILE

    meg = copy("meg")
    (meg / TRACKER_FILE).write_text("1000\n")
    (meg / "iter_0001000").mkdir()
    run = copy("run")
    assert _convert(str(run), str(meg), "--to", "megatron", "--megatron-iteration", "7") == 2
    assert "1000" in capsys.readouterr().err
    assert (meg / TRACKER_FILE).read_text().strip() == "1000"


# ------------------------------------------------------------------- escaping paths
def _record_opens(monkeypatch) -> list[str]:
    opened: list[str] = []
    real = builtins.open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    return opened


@pytest.mark.parametrize("escape", ["absolute", "dotdot"])
def test_torch_dist_references_outside_the_folder_are_refused_unopened(
    copy, tmp_path, monkeypatch, escape
):
    folder = copy("dist")
    outside = tmp_path / "outside.distcp"
    shutil.copy(next(_dist(folder).glob("*.distcp")), outside)
    name = str(outside) if escape == "absolute" else "../../outside.distcp"

    def redirect(metadata):
        for info in metadata.storage_data.values():
            info.relative_path = name

    hostile.edit_metadata(_dist(folder), redirect)
    opened = _record_opens(monkeypatch)
    with pytest.raises(ConversionError, match=r"outside.distcp.*(absolute|leaves the checkpoint)"):
        load_megatron_checkpoint(folder)
    assert not [p for p in opened if p.endswith("outside.distcp")]


def test_hf_index_entries_outside_the_folder_are_refused_unopened(copy, tmp_path, monkeypatch):
    folder = copy("hf")
    shutil.move(folder / "model.safetensors", tmp_path / "x.safetensors")
    index = {"weight_map": {"transformer.wte.weight": "../x.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    opened = _record_opens(monkeypatch)
    with pytest.raises(ValueError, match=r"index.json: file reference '../x.safetensors' leaves"):
        load_hf_checkpoint(folder)
    assert not [p for p in opened if p.endswith("x.safetensors")]


# ---------------------------------------------------------------- one per input class
def test_wrong_type_names_file_and_field(copy):
    folder = copy("llama")
    hostile.edit_json(folder / "config.json", lambda c: c.update(num_attention_heads=[4, 4]))
    with pytest.raises(ConversionError) as err:
        load_hf_checkpoint(folder)
    assert str(err.value) == (
        f"{folder / 'config.json'}: num_attention_heads must be a positive integer, got [4, 4]"
    )
    hostile.edit_json(folder / "config.json", lambda c: c.update(num_attention_heads=4))
    hostile.edit_json(folder / "config.json", lambda c: c.update(rope_scaling="linear"))
    with pytest.raises(ConversionError, match="config.json: rope_scaling must be a mapping"):
        load_hf_checkpoint(folder)


def test_missing_field_names_file_and_field(copy):
    folder = copy("hf")
    hostile.edit_json(folder / "config.json", lambda c: c.pop("n_embd"))
    with pytest.raises(ConversionError, match=r"config.json: n_embd is missing"):
        load_hf_checkpoint(folder)


def test_zero_heads_names_file_and_field(copy):
    meg = copy("meg")
    hostile.edit_rank(
        hostile.rank_file(meg), lambda p: setattr(p["args"], "num_attention_heads", 0)
    )
    with pytest.raises(ConversionError, match=r"model_optim_rng.pt: args.num_attention_heads"):
        load_megatron_checkpoint(meg)
    nemo = copy("nemo")
    yaml = nemo / "context" / "model.yaml"
    yaml.write_text(yaml.read_text().replace("num_attention_heads: 4", "num_attention_heads: 0"))
    with pytest.raises(ConversionError, match=r"model.yaml: num_attention_heads must be"):
        load_megatron_checkpoint(nemo)


def test_deep_nesting_is_refused_naming_the_limit(copy):
    folder = copy("hf")
    (folder / "config.json").write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigFileError, match=r"config.json: the config.json nests deeper than"):
        load_hf_checkpoint(folder)
    nemo = copy("nemo")
    (nemo / "context" / "model.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConversionError, match=r"model.yaml: .*nests deeper than 100 levels"):
        load_megatron_checkpoint(nemo)


BILLION_LAUGHS = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)


def test_yaml_alias_bomb_is_refused(copy):
    nemo = copy("nemo")
    (nemo / "context" / "model.yaml").write_text(BILLION_LAUGHS + "config: {num_layers: 2}\n")
    with pytest.raises(ConversionError, match=r"model.yaml: expands to more than 1000000 values"):
        load_megatron_checkpoint(nemo)


def reference_bomb(levels: int = 40) -> str:
    """A Fiddle io.json whose objects each refer to the next one twice: 2**levels leaves."""
    objects = {"o0": {"type": "leaf", "value": 1}}
    for i in range(1, levels):
        ref = {"type": "ref", "key": f"o{i - 1}"}
        objects[f"o{i}"] = {
            "type": {"type": "pyref", "module": "builtins", "name": "list"},
            "items": [["Index(index=0)", ref], ["Index(index=1)", ref]],
        }
    return json.dumps({"root": {"type": "ref", "key": f"o{levels - 1}"}, "objects": objects})


def test_fiddle_reference_bomb_is_refused(copy):
    nemo = copy("nemo")
    (nemo / "context" / "model.yaml").unlink()
    (nemo / "context" / "io.json").write_text(reference_bomb())
    with pytest.raises(ConversionError, match=r"io.json: refused .*more than 200000 values"):
        load_megatron_checkpoint(nemo)


def test_huge_configuration_file_is_refused_before_reading(copy, monkeypatch):
    nemo = copy("nemo")
    yaml = nemo / "context" / "model.yaml"
    yaml.write_text(yaml.read_text() + "# padding\n" * 200_000)  # 2 MB
    monkeypatch.setenv("EPOCHAL_MAX_CONFIG_BYTES", str(1 << 20))
    with pytest.raises(ConversionError, match=r"model.yaml: .* over the 1048576-byte limit"):
        load_megatron_checkpoint(nemo)


@pytest.mark.parametrize("rows", [1 << 40, -5])
def test_huge_or_negative_declared_tensor_is_refused_before_allocation(copy, rows):
    """Chunks that cover a 128 TiB tensor, but stored in a few KB: refused, not allocated."""
    folder = copy("dist")

    def grow(metadata):
        fqn, meta = hostile.tensor_meta(metadata, "word_embeddings.weight")
        meta.size = torch.Size([rows, meta.size[1]])
        meta.chunks[0].sizes = torch.Size([rows, meta.size[1]])

    hostile.edit_metadata(_dist(folder), grow)
    with pytest.raises(ConversionError, match=r"word_embeddings.weight"):
        load_megatron_checkpoint(folder)


@pytest.mark.parametrize("damage", ["truncated", "empty", "zeroed"])
def test_damaged_distcp_is_named(copy, damage):
    folder = copy("dist")
    shard = next(_dist(folder).glob("*.distcp"))
    size = shard.stat().st_size
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[: size // 2])
    elif damage == "empty":
        shard.write_bytes(b"")
    else:
        shard.write_bytes(bytes(size))
    expect = "truncated" if damage != "zeroed" else "damaged shard file"
    with pytest.raises(ConversionError, match=rf"{shard.name}: {expect}"):
        load_megatron_checkpoint(folder)


def test_truncated_distcp_in_an_epochal_step_without_manifest_is_named(copy):
    run = copy("run")
    step = next((run / "checkpoints").glob("step_*"))
    (step / "manifest.json").unlink(missing_ok=True)
    shard = next(step.glob("*.distcp"))
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size - 100])
    with pytest.raises(CheckpointError, match=rf"{shard.name}: truncated.*must be at least {size}"):
        load_epochal_checkpoint(run)


def test_tp_shards_of_different_shapes_are_refused(copy):
    meg = copy("meg22")

    def cut(payload):
        model = payload["model"]
        name = next(k for k in model if k.endswith("linear_fc1.weight"))
        model[name] = model[name][:-1].clone()

    hostile.edit_rank(hostile.rank_file(meg, 1, 0), cut)
    with pytest.raises(ConversionError, match=r"tensor-parallel shards disagree"):
        load_megatron_checkpoint(meg)


def test_epochal_checkpoint_declaring_huge_positions_is_refused(copy):
    """``epochal generate`` reads through here; 10**12 positions must not reach build_model."""
    run = copy("run")
    step = next((run / "checkpoints").glob("step_*"))
    (step / "manifest.json").unlink(missing_ok=True)

    def huge(state):
        state["model_config"]["max_position_embeddings"] = 10**12

    hostile.edit_json(step / "trainer_state.json", huge)
    with pytest.raises(ConversionError, match=r"max_position_embeddings=1000000000000 is over"):
        load_epochal_checkpoint(run)


BOMB_SCRIPT = r"""
import json, resource, shutil, sys, time, warnings
from pathlib import Path
warnings.simplefilter("ignore")
import torch
from epochal.formats.hf.io import load_hf_checkpoint
from epochal.convert.megatron.legacy import load_megatron_checkpoint
from tests.convert import hostile
from tests.convert.test_convert_hardening import BILLION_LAUGHS, reference_bomb

built, work = Path(sys.argv[1]), Path(sys.argv[2])

def fresh(name):
    return Path(shutil.copytree(built / name, work / f"{name}-{time.monotonic_ns()}"))

def deep_json():
    f = fresh("hf")
    (f / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    load_hf_checkpoint(f)

def alias_bomb():
    f = fresh("nemo")
    (f / "context" / "model.yaml").write_text(BILLION_LAUGHS + "config: {num_layers: 2}\n")
    load_megatron_checkpoint(f)

def reference():
    f = fresh("nemo")
    (f / "context" / "model.yaml").unlink()
    (f / "context" / "io.json").write_text(reference_bomb(60))
    load_megatron_checkpoint(f)

def huge_tensor():
    f = fresh("dist")
    def grow(metadata):
        _, meta = hostile.tensor_meta(metadata, "word_embeddings.weight")
        meta.size = torch.Size([1 << 44, meta.size[1]])
        meta.chunks[0].sizes = meta.size
    hostile.edit_metadata(f / "iter_0000005", grow)
    load_megatron_checkpoint(f)

for case in (deep_json, alias_bomb, reference, huge_tensor):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        case()
        error = "accepted"
    except (ValueError, OSError) as exc:
        error = str(exc)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(json.dumps({"case": case.__name__, "s": time.perf_counter() - t0, "mb": grown,
                      "error": error}), flush=True)
"""


def test_bombs_are_refused_within_seconds_and_bounded_memory(built, tmp_path):
    """Each bomb in a fresh process: refused, its peak memory growth and time measured."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    out = subprocess.run(
        [sys.executable, "-c", BOMB_SCRIPT, str(built), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = {r["case"]: r for r in map(json.loads, out.stdout.splitlines())}
    expected = {
        "deep_json": "nests deeper than 100 levels",
        "alias_bomb": "expands to more than 1000000 values",
        "reference": "more than 200000 values",
        "huge_tensor": "word_embeddings.weight",
    }
    for case, message in expected.items():
        r = results[case]
        assert message in r["error"], r
        assert r["s"] < 20 and r["mb"] < 256, r  # generous on a loaded CI machine


@pytest.mark.parametrize("damage", ["positions", "truncated"])
def test_generate_reads_through_the_same_checks(copy, capsys, damage):
    """``epochal generate`` on a hostile folder: exit 2 with the reader's message, no allocation."""
    from epochal.cli import main

    if damage == "positions":
        folder = copy("hf")
        hostile.edit_json(folder / "config.json", lambda c: c.update(n_positions=10**12))
        expect = "n_positions=1000000000000 is over the limit"
    else:
        folder = copy("run")
        step = next((folder / "checkpoints").glob("step_*"))
        (step / "manifest.json").unlink(missing_ok=True)
        shard = next(step.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
        expect = f"{shard.name}: truncated"
    argv = ["generate", "--checkpoint", str(folder), "--prompt-ids", "1,2", "--max-new-tokens", "2"]
    assert main(argv) == 2
    assert expect in capsys.readouterr().err

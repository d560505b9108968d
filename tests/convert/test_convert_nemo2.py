"""NeMo 2 checkpoints (``weights/`` torch_dist under ``module.``, ``context/model.yaml``) import.

The weights are written by the real Megatron-Core (``dist_checkpointing.save`` of
``model.sharded_state_dict(prefix="module.")``, as NeMo 2's ``MegatronParallel``
saves them); the context is written here in NeMo's Hydra-style YAML. A Llama-style
``GPTModel`` at TP2 and an ESM-2-style ``BertModel`` (BioNeMo) import with
Megatron-Core's logits within 1e-5; contexts we will not read are refused, naming
the file, and ``--model-config`` supplies the configuration instead.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

from epochal.convert.megatron.legacy import load_megatron_checkpoint
from epochal.convert.megatron.nemo2 import is_nemo2, load_nemo2_checkpoint, nemo2_model_fields
from epochal.formats.common import ConversionError
from epochal.model import build_model
from tests.convert.test_convert_megatron_dist import (
    _our_bert_logits,
    assert_imports_with_megatrons_logits,
    save_with_megatron,
)

pytestmark = [pytest.mark.peer, pytest.mark.distributed]
pytest.importorskip("megatron.core")
pytest.importorskip("psutil")

LLAMA_YAML = """\
_target_: nemo.collections.llm.gpt.model.llama.LlamaModel
config:
  _cpu_offloading_context: null
  _target_: nemo.collections.llm.gpt.model.llama.LlamaConfig
  activation_func:
    _call_: false
    _target_: torch.nn.functional.silu
  add_bias_linear: false
  ffn_hidden_size: 64
  gated_linear_unit: true
  hidden_size: 32
  init_method_std: 0.2
  layernorm_epsilon: 1.0e-05
  make_vocab_size_divisible_by: 64
  normalization: RMSNorm
  num_attention_heads: 4
  num_layers: 2
  num_query_groups: 2
  position_embedding_type: rope
  rotary_base: 10000
  seq_length: 32
  share_embeddings_and_output_weights: false
  vocab_size: 100
tokenizer:
  _target_: nemo.collections.common.tokenizers.huggingface.auto_tokenizer.AutoTokenizer
  pretrained_model_name: /models/tokenizer
"""

ESM_YAML = """\
_target_: bionemo.esm2.model.model.ESM2Model
config:
  _target_: bionemo.esm2.model.model.ESM2Config
  num_layers: 2
  hidden_size: 32
  ffn_hidden_size: 48
  num_attention_heads: 4
  layernorm_epsilon: 1.0e-12
  position_embedding_type: rope
  activation_func:
    _call_: false
    _target_: torch.nn.functional.gelu
  token_dropout: false
  seq_length: 64
  vocab_size: 33
  make_vocab_size_divisible_by: 64
  share_embeddings_and_output_weights: true
"""


def write_context(ckpt, model_yaml: str | None) -> None:
    """NeMo 2's context/: model.yaml (read first), and a placeholder io.json beside it."""
    context = ckpt / "context"
    context.mkdir(exist_ok=True)
    (context / "io.json").write_text(json.dumps({"root": {"type": "ref", "key": "x"}}))
    if model_yaml is not None:
        (context / "model.yaml").write_text(model_yaml)


def llama_fields() -> dict:
    """LLAMA_YAML's config fields (``activation_func`` as its function name)."""
    import yaml

    fields = yaml.safe_load(LLAMA_YAML)["config"]
    fields = {k: v for k, v in fields.items() if not k.startswith("_")}
    fields["activation_func"] = "silu"
    return fields


@pytest.fixture(scope="module")
def llama_nemo(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("nemo") / "llama"
    tokens = save_with_megatron(ckpt, 2, "llama-nemo")
    write_context(ckpt, LLAMA_YAML)
    return ckpt, tokens


def test_llama_nemo2_imports_with_megatrons_logits_and_on_to_hf(tmp_path, llama_nemo):
    ckpt, tokens = llama_nemo
    assert is_nemo2(ckpt)
    ck = load_megatron_checkpoint(ckpt)  # detected
    assert ck.config.num_kv_heads == 2
    assert ck.config.activation == "swiglu" and not ck.config.tie_embeddings
    reference = torch.load(ckpt / "logits.pt")
    assert_imports_with_megatrons_logits(ck, tokens, reference, ckpt, tmp_path)


def test_esm2_nemo2_imports_with_megatrons_logits(tmp_path):
    ckpt = tmp_path / "esm"
    tokens = save_with_megatron(ckpt, 1, "esm-nemo")
    write_context(ckpt, ESM_YAML)
    ck = load_nemo2_checkpoint(ckpt)
    assert ck.config.type == "esm" and ck.config.mask_token_id == 32 and ck.config.pad_token_id == 1
    model = build_model(ck.config).eval()
    model.load_state_dict(ck.state, strict=True)
    mlm, _, real = _our_bert_logits(model, tokens)
    theirs = torch.load(ckpt / "logits.pt")
    torch.testing.assert_close(mlm[real][:, :33], theirs[real][:, :33], atol=1e-5, rtol=1e-5)
    # BioNeMo's default fused bias-GELU is Megatron-Core's tanh GELU: imported as such
    fused = tmp_path / "fused.json"
    fused.write_text(json.dumps({"bias_activation_fusion": True}))
    with pytest.warns(UserWarning, match="tanh GELU"):
        assert load_nemo2_checkpoint(ckpt, model_config=fused).config.activation == "gelu_tanh"


def test_refused_contexts_are_named_and_model_config_replaces_them(tmp_path, llama_nemo):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama_nemo[0], ckpt)
    from epochal.cli import main

    # pickled artifacts only: never unpickled
    (ckpt / "context" / "model.yaml").unlink()
    (ckpt / "context" / "io.json").unlink()
    (ckpt / "context" / "io.pkl").write_bytes(b"\x80\x04N.")
    with pytest.raises(ConversionError, match=r"neither model.yaml nor io.json.*--model-config"):
        load_nemo2_checkpoint(ckpt)
    # an io.json that is not Fiddle's graph
    (ckpt / "context" / "io.json").write_text(json.dumps({"model": "LlamaModel"}))
    with pytest.raises(ConversionError, match=r"io.json: refused .*not Fiddle's JSON"):
        load_nemo2_checkpoint(ckpt)
    # a model.yaml with Python object tags: never constructed
    (ckpt / "context" / "model.yaml").write_text(
        "config: !!python/object/apply:os.system ['echo unsafe']\n"
    )
    with pytest.raises(ConversionError, match=r"model.yaml: refused .*Python objects"):
        load_nemo2_checkpoint(ckpt)
    # the configuration from --model-config instead
    fields = tmp_path / "llama.json"
    fields.write_text(json.dumps(llama_fields()))
    ck = load_nemo2_checkpoint(ckpt, model_config=fields)
    with pytest.raises(ConversionError, match="applies to NeMo 2 checkpoints"):
        load_megatron_checkpoint(ckpt / "weights", model_config=fields)  # torch_dist, not NeMo
    reference = load_megatron_checkpoint(llama_nemo[0])
    assert ck.config == reference.config
    assert all(torch.equal(ck.state[k], v) for k, v in reference.state.items())
    out = tmp_path / "run"
    assert (
        main(["convert", str(ckpt), str(out), "--to", "epochal", "--model-config", str(fields)])
        == 0
    )
    assert main(["convert", str(ckpt), str(tmp_path / "x"), "--to", "epochal"]) == 2


def test_missing_heads_are_asked_for_and_defaults_are_warned(tmp_path, llama_nemo):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama_nemo[0], ckpt)
    # A recipe's config class with its defaults: model.yaml names the class only.
    (ckpt / "context" / "model.yaml").write_text(
        "_target_: nemo.collections.llm.gpt.model.llama.LlamaModel\n"
        "config:\n  _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B\n"
    )
    with pytest.raises(ConversionError, match="does not state num_attention_heads"):
        load_nemo2_checkpoint(ckpt)
    fields = tmp_path / "heads.json"
    fields.write_text(
        json.dumps({"num_attention_heads": 4, "num_query_groups": 2, "vocab_size": 100})
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ck = load_nemo2_checkpoint(ckpt, model_config=fields)
    assert any("layernorm_epsilon, rotary_base, rotary_percent" in str(w.message) for w in caught)
    # shapes give the rest: 2 layers, hidden 32, SwiGLU 64, RMSNorm, RoPE, untied
    reference = load_megatron_checkpoint(llama_nemo[0]).config
    assert (ck.config.num_layers, ck.config.hidden_size, ck.config.ffn_size) == (2, 32, 64)
    assert ck.config.activation == reference.activation and ck.config.normalization == "RMSNorm"
    # a configuration the weights contradict is refused
    fields.write_text(json.dumps({"num_attention_heads": 4, "num_layers": 3}))
    with pytest.raises(ConversionError, match="num_layers=3.*weights show 2"):
        load_nemo2_checkpoint(ckpt, model_config=fields)


def test_io_json_is_read_as_data_without_model_yaml(tmp_path, llama_nemo):
    """NeMo 2.0 contexts have io.json only: the real Fiddle serialization, walked as JSON."""
    pytest.importorskip("fiddle")
    from tests.convert.nemo_context import io_json

    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama_nemo[0], ckpt)
    (ckpt / "context" / "model.yaml").unlink()
    (ckpt / "context" / "io.json").write_text(io_json(llama_fields()))
    fields, target = nemo2_model_fields(ckpt)
    assert target.endswith("nemo_context.LlamaModel tests.convert.nemo_context.LlamaConfig")
    assert fields["activation_func"] == "torch.nn.functional.silu"
    assert fields["num_query_groups"] == 2 and fields["rotary_base"] == 10000
    ck = load_nemo2_checkpoint(ckpt)
    reference = load_megatron_checkpoint(llama_nemo[0])
    assert ck.config == reference.config
    assert all(torch.equal(ck.state[k], v) for k, v in reference.state.items())


def test_post_ln_bert_from_nemo_is_refused(tmp_path, llama_nemo):
    fields = tmp_path / "post_ln.json"
    fields.write_text(json.dumps({"bert_type": "huggingface", "num_attention_heads": 4}))
    with pytest.raises(ConversionError, match="post-LN BERT"):
        load_nemo2_checkpoint(llama_nemo[0], model_config=fields)

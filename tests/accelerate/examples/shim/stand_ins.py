"""Offline stand-ins for what Accelerate's and transformers' example scripts download.

- ``AutoTokenizer.from_pretrained(name)``: a word-level tokenizer built offline with
  Hugging Face ``tokenizers`` over the stand-in corpus's words: BERT's special tokens
  and pair template for BERT/RoBERTa names, GPT-2's ``<|endoftext|>`` (and no pad
  token) for the causal ones.
- ``AutoConfig.from_pretrained`` / ``AutoModel*.from_pretrained(name)``: that family at
  2 layers, hidden 64, 4 heads, with random weights drawn from a fixed seed (the
  same in every process, and the global random state is left alone, as loading real
  weights leaves it); the model is in evaluation mode, as ``from_pretrained`` leaves it.
- ``datasets.load_dataset``: GLUE MRPC (``sentence1``, ``sentence2``, ``label``,
  ``idx``) and WikiText (``text``, with WikiText's empty lines) as small in-memory
  ``DatasetDict``\\ s, drawn from a fixed seed.

Sizes (rows per split) come from ``EPOCHAL_EXAMPLE_ROWS`` (``train,validation``), so a
test keeps a run to a few steps.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import random
import sys
from typing import Any

#: model name (as the scripts spell it) -> family
FAMILIES = {
    "bert-base-cased": "bert",
    "bert-base-uncased": "bert",
    "google-bert/bert-base-cased": "bert",
    "gpt2": "gpt2",
    "openai-community/gpt2": "gpt2",
    "HuggingFaceTB/SmolLM-360M": "llama",
}
MAX_LENGTH = 64
WORDS = [
    f"{a}{b}"
    for a in ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze")
    for b in ("", "n", "r", "s", "t", "l", "m", "k")
]


def _rows() -> tuple[int, int]:
    text = os.environ.get("EPOCHAL_EXAMPLE_ROWS", "64,64")
    train, validation = (int(x) for x in text.split(","))
    return train, validation


def _family(name: Any) -> str:
    name = str(name)
    if name in FAMILIES:
        return FAMILIES[name]
    raise OSError(
        f"offline stand-in: no tiny model for {name!r} (known: {', '.join(sorted(FAMILIES))})"
    )


# ---------------------------------------------------------------- tokenizer
def tokenizer_for(name: Any, **kwargs: Any):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    family = _family(name)
    if family == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    else:
        specials = ["<|endoftext|>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS + [".", ","])}
    unk = "[UNK]" if family == "bert" else "<unk>"
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
    )
    if family == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            model_max_length=MAX_LENGTH,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=MAX_LENGTH,
        unk_token="<unk>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],
    )


# ---------------------------------------------------------------- models
def config_for(name: Any, **overrides: Any):
    import transformers

    family = _family(name)
    vocab = len(WORDS) + 7
    if family == "bert":
        config = transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=MAX_LENGTH,
        )
    elif family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab - 3,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=MAX_LENGTH,
            bos_token_id=0,
            eos_token_id=0,
        )
    else:
        config = transformers.LlamaConfig(
            vocab_size=vocab - 3,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=128,
            max_position_embeddings=MAX_LENGTH,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=0,
        )
    config.name_or_path = str(name)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


#: from_pretrained keywords about loading, not about the model
_LOADING = {
    "from_tf", "trust_remote_code", "revision", "token", "cache_dir", "low_cpu_mem_usage",
    "torch_dtype", "dtype", "device_map", "use_safetensors", "local_files_only",
}  # fmt: skip


def model_for(cls: Any, name: Any, *args: Any, config: Any = None, **kwargs: Any):
    import torch

    family = _family(name)
    overrides = {k: v for k, v in kwargs.items() if k not in _LOADING}
    config = config_for(name, **overrides) if config is None else config
    seed = sum(map(ord, f"{family}:{cls.__name__}")) % 2**31
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.eval()
    return model


# ---------------------------------------------------------------- datasets
def _sentence(rng: random.Random, lo: int = 4, hi: int = 20) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words) + " ."


def _mrpc(n: int, seed: int):
    import datasets

    rng = random.Random(seed)
    rows: dict[str, list] = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    for i in range(n):
        first = _sentence(rng)
        label = rng.randint(0, 1)
        # a paraphrase keeps the words in another order; a non-paraphrase has new words
        words = first[:-2].split()
        rng.shuffle(words)
        second = " ".join(words) + " ." if label else _sentence(rng)
        for key, value in zip(rows, (first, second, label, i), strict=True):
            rows[key].append(value)
    features = datasets.Features(
        {
            "sentence1": datasets.Value("string"),
            "sentence2": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["not_equivalent", "equivalent"]),
            "idx": datasets.Value("int32"),
        }
    )
    return datasets.Dataset.from_dict(rows, features=features)


def _wikitext(n: int, seed: int):
    import datasets

    rng = random.Random(seed)
    text = ["" if i % 5 == 4 else _sentence(rng, 6, 40) for i in range(n)]
    return datasets.Dataset.from_dict({"text": text})


def load_dataset(path: Any, name: Any = None, *args: Any, split: Any = None, **kwargs: Any):
    import datasets

    path = str(path)
    train, validation = _rows()
    if path in ("glue", "nyu-mll/glue") and name == "mrpc":
        make = _mrpc
    elif path in ("wikitext", "Salesforce/wikitext") and str(name).startswith("wikitext-"):
        make = _wikitext
        # WikiText has empty lines: whole rows survive a script's filter of them
        train, validation = train * 5 // 4, validation * 5 // 4
    else:
        raise OSError(f"offline stand-in: no dataset for load_dataset({path!r}, {name!r})")
    splits = datasets.DatasetDict(
        train=make(train, 1), validation=make(validation, 2), test=make(validation, 3)
    )
    if split is None:
        return splits
    if split in splits:
        return splits[split]
    raise OSError(f"offline stand-in: no split {split!r} (has train, validation, test)")


# ---------------------------------------------------------------- installation
def _patch_transformers(module: Any) -> None:
    from transformers.models.auto import (
        auto_factory,
        configuration_auto,
        modeling_auto,
        tokenization_auto,
    )

    tokenization_auto.AutoTokenizer.from_pretrained = staticmethod(tokenizer_for)
    configuration_auto.AutoConfig.from_pretrained = staticmethod(config_for)
    # each Auto class holds its own copy of the method
    for value in [auto_factory._BaseAutoModelClass, *vars(modeling_auto).values()]:
        if isinstance(value, type) and issubclass(value, auto_factory._BaseAutoModelClass):
            value.from_pretrained = classmethod(_auto_model)


def _auto_model(cls: Any, name: Any, *args: Any, **kwargs: Any):
    import transformers

    config = kwargs.pop("config", None)
    if config is None:
        overrides = {k: v for k, v in kwargs.items() if k not in _LOADING}
        config = config_for(name, **overrides)
    model_class = cls._model_mapping[type(config)]
    if isinstance(model_class, tuple | list):
        model_class = model_class[0]
    assert issubclass(model_class, transformers.PreTrainedModel)
    return model_for(model_class, name, config=config)


def _patch_datasets(module: Any) -> None:
    module.load_dataset = load_dataset
    import datasets.load

    datasets.load.load_dataset = load_dataset


_PATCHES = {"transformers": _patch_transformers, "datasets": _patch_datasets}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch) -> None:
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, _PATCHES[fullname])
        return spec


def install() -> None:
    """Patch ``transformers`` and ``datasets`` when they are imported (now, if they are)."""
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())

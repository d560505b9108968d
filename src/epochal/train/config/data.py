"""The ``[data]`` section: paths, splits, sequence lengths, tokenizer, masking."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from epochal._checks import ConfigError, check_fields, checked, is_int, is_real, require
from epochal.data.datasets.dataset_builder import parse_blend
from epochal.data.indexed.tokenizer_wordpiece import MAX_VOCAB_EXTRA_IDS

__all__ = [
    "DataConfig",
]


# ------------------------------------------------------------------------ data
@dataclass(kw_only=True)
class DataConfig:
    """The ``[data]`` section.

    Exactly one data source: ``corpus``, ``mock``, the paths (``data_path`` or the
    per-split paths) or a protein source (``protein_path`` or BioNeMo's cluster files).
    Setting two is a :class:`ConfigError` naming both; an option given explicitly
    (config file or override) replaces a preset's other source (see :func:`build_config`).

    ESM-2 pretraining (``model.type = "esm"``, :mod:`epochal.train.inputs.esm`) reads one
    protein source with BioNeMo's samples; BioNeMo's ``train_esm2`` flags are named in
    brackets. ``mock = true`` there means deterministic synthetic protein families (FASTA +
    clusters written to ``cache_dir``), the ``esm-tiny`` preset's default;
    ``masking_probability`` is ESM's ``mask_prob`` and ``seq_length`` the
    ``max_seq_length`` crop, ``<cls>``/``<eos>`` included [``--max-seq-length``].

    Attributes:
        data_path: Megatron-style blend: ``["prefix"]`` or
            ``["w1", "prefix1", "w2", "prefix2", ...]`` (prefixes of ``.bin``/``.idx``).
        split: Megatron's train/valid/test split of ``data_path``, e.g. ``"969,30,1"``.
        blend_schedule: training blend weights that change over the run: a list of
            ``{step = S, weights = [w1, w2, ...]}`` points, one weight per prefix of
            ``data_path`` (or ``train_data_path``) in order, steps increasing (two
            points at the same step make a jump there, also under ``"linear"``), weights
            ``>= 0`` with one positive per point (a source may enter with weight 0 and
            rise later). Point ``step = S`` holds from global sample ``S *
            global_batch_size`` (the samples of the first ``S`` steps under
            ``training.rampup_batch_size``), i.e. from step ``S + 1`` on. The weights
            replace ``data_path``'s for the train split
            (validation keeps ``data_path``'s blend). Each point's weights are
            normalized; before the first point its weights hold, after the last the
            last's. A constant schedule reads exactly Megatron's blend of those weights.
            On resume, later points may change; earlier ones may not (refused, naming the
            step). See :mod:`epochal.data.datasets.scheduled_blend`.
        blend_schedule_interpolation: ``"step"`` (each point's weights hold until the
            next point) or ``"linear"`` (the normalized weights ramp linearly, sample by
            sample, between points).
        train_data_path / valid_data_path / test_data_path: a separate blend per split
            (Megatron's ``--train-data-path`` ...), instead of ``data_path`` + ``split``.
        seq_length: tokens per sample (>= 1).
        mock: train on Megatron's mock GPT corpus (no files needed; ids below
            ``model.vocab_size``, default 8192); for ESM, synthetic protein families.
        corpus: if set, tokenize this corpus first (cached) and train on it:
            ``"stdlib"`` (Python's standard-library sources, a deterministic
            subset in sorted path order), a ``.jsonl`` path (a document per line) or a
            ``.txt`` path (documents separated by blank lines).
        corpus_max_bytes: how much of the ``stdlib`` corpus to use (bytes of source).
        json_keys: JSON keys holding the text of a JSONL corpus.
        tokenizer_type: Megatron's names: ``GPT2BPETokenizer`` (local GPT-2 files by
            default), ``HuggingFaceTokenizer``, ``TikTokenizer``, ``ByteLevelTokenizer``,
            ... ``""`` (the default): the tokenizer ``epochal preprocess`` recorded
            next to the data paths' ``.idx`` files (``<prefix>.tokenizer.json``), else
            ``GPT2BPETokenizer``. A tokenizer other than the recorded one is refused.
        tokenizer_model / vocab_file / merge_file: tokenizer files (Megatron's names).
        bpe_vocab_size: with ``corpus``: if > 0, train a byte-level BPE tokenizer of
            this many ids on the corpus (cached; deterministic) and use it instead of
            ``tokenizer_type``; a small vocabulary keeps a CPU demo fast.
        cache_dir: where prepared corpora, tokenizers and index caches go
            (default ``$EPOCHAL_CACHE`` or ``~/.cache/epochal``).
        num_workers: DataLoader worker processes (0 = in the main process).
        reset_position_ids / reset_attention_mask / eod_mask_loss: Megatron's GPT
            dataset options (positions and attention restart at each document;
            no loss on end-of-document tokens).
        split_sentences: with ``corpus``: one sequence per sentence, documents kept
            (Megatron's ``--split-sentences``, :func:`epochal.data.split_sentences`),
            no end-of-document token: the corpus BERT's data needs.
        wordpiece_vocab_size: with ``corpus``: if > 0, train a WordPiece vocabulary of
            this many ids on the corpus (offline, deterministic, cached) and use
            ``BertWordPieceLowerCase`` with it instead of ``tokenizer_type``.
        masking_probability: the fraction of tokens a masked-LM sample masks (BERT, ESM)
            or T5 corrupts into spans.
        short_sequence_probability: BERT: the probability that a sample is shorter than
            ``seq_length`` (Megatron's ``--short-seq-prob``).
        masking_max_ngram: BERT / T5: the longest N-gram masked as one span.
        masking_do_full_word: BERT: mask whole words (all WordPiece pieces of a word).
        masking_do_permutation: BERT: permute the masked N-grams (Megatron's option).
        masking_use_longer_ngrams: BERT: favour longer N-grams (Megatron's option).
        masking_use_geometric_distribution: BERT / T5: draw N-gram lengths from a
            geometric distribution (Megatron's ``pretrain_t5`` uses it with N-grams up
            to 10: the ``t5-tiny`` preset sets that). The masking options are validated
            by the data layer; errors name them.
        seq_length_decoder: T5: decoder tokens per sample (Megatron's
            ``--decoder-seq-length``; ``seq_length`` is the encoder's).
        vocab_extra_ids: WordPiece tokenizers: append this many ``<extra_id_N>``
            sentinels (Megatron's ``--vocab-extra-ids``; T5 needs them, e.g. 100).
        pack_sequences: BERT / ESM: train on packed sequences (THD): each
            micro-batch's samples (the same samples, in the same order) are
            concatenated without their padding into one row
            (:func:`epochal.data.loading.packing.pack_padded_batch`), attention is
            confined to each sample and positions restart per sample, so the loss
            is the padded batch's (up to float rounding) for less compute. Not with
            pipeline parallelism (a :class:`ConfigError`); under sequence parallelism
            the row is padded to a multiple of ``parallel.tensor_parallel``, under
            context parallelism of ``2 * parallel.context_parallel``, with a
            loss-masked tail.
        train_cluster_path / train_database_path: ESM: BioNeMo's layout: a parquet of
            training clusters (``ur90_id``: member ids per row) and the SQLite database
            ``protein(id, sequence)`` [``--train-cluster-path``, ``--train-database-path``].
        valid_cluster_path / valid_database_path: ESM: the validation clusters
            (``ur50_id``, one id per row) and their database (default: the training one)
            [``--valid-cluster-path``, ``--valid-database-path``]; none: no validation.
        protein_path: ESM: instead, one FASTA (plain/gz), CSV, TSV or parquet file,
            converted once into that layout under ``cache_dir`` and split into
            train/valid clusters.
        protein_clusters: with ``protein_path``: an MMseqs2 TSV
            (``representative<TAB>member``); without it every protein is its own cluster.
        protein_valid_fraction: with ``protein_path``: the fraction of clusters held out
            for validation (in [0, 1); at least one cluster when positive), picked by a
            permutation seeded by ``training.seed``.
        protein_sequence_column / protein_id_column: ESM: table inputs' columns (no id
            column: ``<file stem>_<row>``).
        mask_token_prob: ESM: the fraction of selected residues that become ``<mask>``
            (BioNeMo's ``mask_token_prob``).
        mask_random_prob: ESM: the fraction that become a random token (BioNeMo's
            ``mask_random_prob``).
        random_mask_strategy: ESM: ``"all_tokens"`` (BioNeMo's default) or
            ``"amino_acids_only"`` [``--random-mask-strategy``].
    """

    data_path: list[str] = field(default_factory=list)
    split: str = "969,30,1"
    blend_schedule: list[dict[str, Any]] = field(default_factory=list)
    blend_schedule_interpolation: str = "step"
    train_data_path: list[str] = field(default_factory=list)
    valid_data_path: list[str] = field(default_factory=list)
    test_data_path: list[str] = field(default_factory=list)
    seq_length: int = checked(1024, ge=1)
    mock: bool = False
    corpus: str = ""
    corpus_max_bytes: int = checked(4_000_000, ge=1)
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    tokenizer_type: str = ""
    tokenizer_model: str = ""
    vocab_file: str = ""
    merge_file: str = ""
    bpe_vocab_size: int = 0
    cache_dir: str = ""
    num_workers: int = checked(0, ge=0)
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    split_sentences: bool = False
    wordpiece_vocab_size: int = 0
    masking_probability: float = checked(0.15, ge=0, le=1)
    short_sequence_probability: float = 0.1
    masking_max_ngram: int = 3
    masking_do_full_word: bool = True
    masking_do_permutation: bool = False
    masking_use_longer_ngrams: bool = False
    masking_use_geometric_distribution: bool = False
    seq_length_decoder: int = checked(128, ge=1)
    vocab_extra_ids: int = 0
    pack_sequences: bool = False
    train_cluster_path: str = ""
    train_database_path: str = ""
    valid_cluster_path: str = ""
    valid_database_path: str = ""
    protein_path: str = ""
    protein_clusters: str = ""
    protein_valid_fraction: float = checked(0.02, ge=0, lt=1)
    protein_sequence_column: str = "sequence"
    protein_id_column: str = ""
    mask_token_prob: float = checked(0.8, ge=0, le=1)
    mask_random_prob: float = checked(0.1, ge=0, le=1)
    random_mask_strategy: str = "all_tokens"

    def __post_init__(self) -> None:
        check_fields(self)
        require(
            0 <= self.vocab_extra_ids <= MAX_VOCAB_EXTRA_IDS,
            "vocab_extra_ids",
            f"must be between 0 and {MAX_VOCAB_EXTRA_IDS:,} (T5 uses 100), got {self.vocab_extra_ids:,}",
        )
        require(
            self.wordpiece_vocab_size == 0 or 100 <= self.wordpiece_vocab_size <= 1_000_000,
            "wordpiece_vocab_size",
            f"must be 0 (off) or in [100, 1000000], got {self.wordpiece_vocab_size}",
        )
        require(
            not (self.wordpiece_vocab_size and self.bpe_vocab_size),
            "wordpiece_vocab_size",
            "and data.bpe_vocab_size cannot both be set (one trained tokenizer)",
        )
        require(
            self.bpe_vocab_size == 0 or 260 <= self.bpe_vocab_size <= 1_000_000,
            "bpe_vocab_size",
            f"must be 0 (off) or in [260, 1000000], got {self.bpe_vocab_size}",
        )
        require(bool(self.json_keys), "json_keys", "must name at least one key")
        parts = self.split.replace("/", ",").split(",")
        try:
            weights = [float(p) for p in parts]
        except ValueError:
            weights = []
        require(
            1 <= len(weights) <= 3
            and all(w >= 0 and math.isfinite(w) for w in weights)
            and sum(weights) > 0,
            "split",
            f"must be 1-3 comma-separated non-negative weights like '969,30,1', got {self.split!r}",
        )
        for name in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
            try:
                parse_blend(getattr(self, name), name)
            except ValueError as exc:
                raise ConfigError(name, str(exc).removeprefix(f"{name}: ")) from None
        per_split = self.train_data_path or self.valid_data_path or self.test_data_path
        require(
            not (self.data_path and per_split),
            "data_path",
            "give data_path (+ split) or train/valid/test_data_path, not both",
        )
        self._check_proteins()
        self._check_blend_schedule()
        sources = [name for name in ("corpus", "mock", "protein_path") if getattr(self, name)]
        if self.train_cluster_path:
            sources.append("train_cluster_path")
        if self.has_paths:
            sources.append("data_path" if self.data_path else "train_data_path")
        if len(sources) > 1:
            raise ConfigError(
                sources[0],
                f"is {getattr(self, sources[0])!r} and data.{sources[1]} is also set; set one data source "
                "(data.corpus, data.mock, data.data_path / data.train_data_path ..., "
                "data.protein_path or data.train_cluster_path)",
            )

    def _check_blend_schedule(self) -> None:
        """``blend_schedule``: points ``{step, weights}``, as many weights as the blend's prefixes."""
        require(
            self.blend_schedule_interpolation in ("step", "linear"),
            "blend_schedule_interpolation",
            f"must be 'step' or 'linear', got {self.blend_schedule_interpolation!r}",
        )
        if not self.blend_schedule:
            return
        paths = self.data_path or self.train_data_path
        blend = parse_blend(paths, "data_path") if paths else None
        require(
            blend is not None and len(blend[0]) >= 2,
            "blend_schedule",
            "needs a blend of at least two prefixes in data.data_path or data.train_data_path "
            "(one schedule weight per prefix)",
        )
        width = len(blend[0]) if blend else 0
        last, repeats = -1, 0
        for p, point in enumerate(self.blend_schedule):
            where = f"point {p}"
            require(
                isinstance(point, dict) and set(point) == {"step", "weights"},
                "blend_schedule",
                f"{where} must be {{step = S, weights = [...]}}, got {point!r}",
            )
            step, weights = point["step"], point["weights"]
            require(
                is_int(step) and step >= 0,
                "blend_schedule",
                f"{where}: step must be an integer >= 0, got {step!r}",
            )
            require(
                step > last or (step == last and repeats < 1),
                "blend_schedule",
                f"{where}: steps must increase (two points at one step make a jump), "
                f"got step {step} after step {last}" + (" twice" if step == last else ""),
            )
            repeats = repeats + 1 if step == last else 0
            last = step
            require(
                isinstance(weights, list) and len(weights) == width,
                "blend_schedule",
                f"{where} (step {step}): needs {width} weights, one per prefix of the blend, "
                f"got {weights!r}",
            )
            require(
                all(is_real(w) and w >= 0 for w in weights),
                "blend_schedule",
                f"{where} (step {step}): weights must be numbers >= 0, got {weights!r}",
            )
            require(
                sum(weights) > 0,
                "blend_schedule",
                f"{where} (step {step}): at least one weight must be > 0, got {weights!r}",
            )

    def _check_proteins(self) -> None:
        """The ESM options: probabilities, the strategy, paths that need each other."""
        require(
            self.mask_token_prob + self.mask_random_prob <= 1.0,
            "mask_token_prob",
            f"+ data.mask_random_prob must be <= 1, got {self.mask_token_prob} + "
            f"{self.mask_random_prob}",
        )
        require(
            self.random_mask_strategy in ("all_tokens", "amino_acids_only"),
            "random_mask_strategy",
            f"must be 'all_tokens' or 'amino_acids_only', got {self.random_mask_strategy!r}",
        )
        require(
            bool(self.protein_sequence_column),
            "protein_sequence_column",
            "must name the sequence column",
        )
        require(
            not self.protein_clusters or bool(self.protein_path),
            "protein_clusters",
            "needs data.protein_path (the proteins the clusters group)",
        )
        require(
            bool(self.train_cluster_path) == bool(self.train_database_path),
            "train_database_path" if self.train_cluster_path else "train_cluster_path",
            "data.train_cluster_path and data.train_database_path go together (BioNeMo's layout)",
        )
        for name in ("valid_cluster_path", "valid_database_path"):
            require(
                not getattr(self, name) or bool(self.train_cluster_path),
                name,
                "needs data.train_cluster_path and data.train_database_path",
            )
        require(
            not self.valid_database_path or bool(self.valid_cluster_path),
            "valid_database_path",
            "needs data.valid_cluster_path (the validation clusters it holds)",
        )

    @property
    def has_proteins(self) -> bool:
        """Whether a protein source (``protein_path`` or BioNeMo's cluster files) is set."""
        return bool(self.protein_path or self.train_cluster_path)

    @property
    def has_paths(self) -> bool:
        """Whether any data path (blend or per-split) is set."""
        return bool(
            self.data_path or self.train_data_path or self.valid_data_path or self.test_data_path
        )

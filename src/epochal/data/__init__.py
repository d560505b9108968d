"""Megatron-compatible datasets and loaders, deterministic per index and resumable.

This layer never imports :mod:`epochal.model`, :mod:`epochal.parallel` or
:mod:`epochal.train`. Names are loaded lazily from their defining modules.
"""

from epochal._lazy import lazy_exports

# public name -> defining submodule of epochal.data
_EXPORTS = {
    # epochs and resampling
    "EpochIndex": "epochs.epoch_index",
    "MultiEpochDataset": "epochs.epoch_index",
    "SizedDataset": "epochs.epoch_index",
    "permute": "epochs.permutation",
    "permute_array": "epochs.permutation",
    "permute_grouped": "epochs.permutation",
    "derive_seed": "epochs.permutation",
    "derive_seed_array": "epochs.permutation",
    "MultiEpochDatasetResampler": "epochs.multi_epoch",
    "MultiEpochDatasetWrapper": "epochs.multi_epoch",
    "IdentityMultiEpochDatasetWrapper": "epochs.multi_epoch",
    "PRNGResampleDataset": "epochs.prng_resample",
    "resample_indices": "epochs.prng_resample",
    "MaskedTokenDataset": "epochs.masking",
    "SpanCorruptionDataset": "epochs.span_corruption",
    # indexed files and tokenizers
    "IndexedDataset": "indexed.indexed_dataset",
    "IndexedDatasetBuilder": "indexed.indexed_dataset",
    "IndexedFileError": "indexed.indexed_format",
    "write_indexed_dataset": "indexed.indexed_dataset",
    "Tokenizer": "indexed.tokenizer",
    "ByteLevelTokenizer": "indexed.tokenizer",
    "GPT2BPETokenizer": "indexed.tokenizer",
    "HuggingFaceTokenizer": "indexed.tokenizer",
    "TiktokenTokenizer": "indexed.tokenizer",
    "build_tokenizer": "indexed.tokenizer",
    "find_gpt2_bpe_files": "indexed.tokenizer",
    "BertWordPieceTokenizer": "indexed.tokenizer_wordpiece",
    "train_wordpiece": "indexed.tokenizer_wordpiece",
    "ESM2Tokenizer": "indexed.tokenizer_esm",
    "SentenceSplitter": "indexed.sentence_split",
    "split_sentences": "indexed.sentence_split",
    "merge_indexed_datasets": "indexed.indexed_dataset",
    "preprocess_documents": "indexed.preprocess",
    "PreprocessSummary": "indexed.preprocess",
    "PreprocessError": "indexed.preprocess_encoding",
    # GPT packing and blending
    "GPTDataset": "datasets.gpt_dataset",
    "BlendedDataset": "datasets.blended_dataset",
    "BlendSchedule": "datasets.blend_schedule",
    "ScheduledBlendedDataset": "datasets.scheduled_blend",
    "GPTDatasetConfig": "datasets.dataset_builder",
    "build_gpt_datasets": "datasets.dataset_builder",
    "parse_blend": "datasets.dataset_builder",
    "MockGPTLowLevelDataset": "datasets.mock_gpt",
    "parse_split": "datasets.splits",
    "split_document_ranges": "datasets.splits",
    "CacheRebuildWarning": "datasets.index_cache",
    # BERT masked-LM samples
    "BERTDataset": "datasets.bert_dataset",
    "BERTDatasetConfig": "datasets.bert_builder",
    "build_bert_datasets": "datasets.bert_builder",
    "T5Dataset": "datasets.t5_dataset",
    "T5DatasetConfig": "datasets.t5_builder",
    "build_t5_datasets": "datasets.t5_builder",
    # proteins and ESM-2 pretraining (BioNeMo's layout and samples)
    "ESMMaskedResidueDataset": "proteins.esm_dataset",
    "RandomMaskStrategy": "proteins.esm_dataset",
    "ProteinSQLiteDataset": "proteins.database",
    "ProteinInputError": "proteins.sequences",
    "create_train_dataset": "proteins.esm_builders",
    "create_valid_dataset": "proteins.esm_builders",
    "create_valid_clusters": "proteins.esm_builders",
    "build_esm_datasets": "proteins.esm_builders",
    "proteins_to_bionemo_layout": "proteins.layout",
    "ProteinLayout": "proteins.layout",
    "read_proteins": "proteins.readers",
    "read_mmseqs_clusters": "proteins.readers",
    "read_aaanalysis_proteins": "proteins.aaanalysis_data",
    "bert_padding_collate_fn": "proteins.collate",
    # samplers and loaders
    "MegatronPretrainingSampler": "loading.samplers",
    "MegatronPretrainingRandomSampler": "loading.samplers",
    "MegatronDataSampler": "loading.data_sampler",
    "WrappedDataLoader": "loading.loader",
    "MegatronDataModule": "loading.datamodule",
    "MegatronPretrainingBatchSampler": "loading.samplers",
    "SamplerConfigError": "loading.samplers",
    "NumMicroBatchesCalculator": "loading.microbatches",
    "ConstantNumMicroBatchesCalculator": "loading.microbatches",
    "RampupBatchsizeNumMicroBatchesCalculator": "loading.microbatches",
    "build_num_microbatches_calculator": "loading.microbatches",
    "MicroBatchConfigError": "loading.microbatches",
    "PAD": "loading.padding",
    "PaddingIndex": "loading.padding",
    "PaddedDataset": "loading.padding",
    "DataExhaustedError": "loading.loader",
    "LoaderStateError": "loading.loader",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

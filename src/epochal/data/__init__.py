"""Megatron-compatible datasets and loaders, deterministic per index and resumable.

This layer never imports :mod:`epochal.model`, :mod:`epochal.parallel` or
:mod:`epochal.train`. Names are loaded lazily from their defining modules.
"""

from epochal._lazy import lazy_exports

# public name -> defining submodule of epochal.data
_EXPORTS = {
    # epochs and resampling
    "EpochIndex": "epoch_index",
    "MultiEpochDataset": "epoch_index",
    "SizedDataset": "epoch_index",
    "permute": "permutation",
    "permute_array": "permutation",
    "permute_grouped": "permutation",
    "derive_seed": "permutation",
    "derive_seed_array": "permutation",
    "MultiEpochDatasetResampler": "multi_epoch",
    "MultiEpochDatasetWrapper": "multi_epoch",
    "IdentityMultiEpochDatasetWrapper": "multi_epoch",
    "PRNGResampleDataset": "prng_resample",
    "resample_indices": "prng_resample",
    "MaskedTokenDataset": "masking",
    # indexed files and tokenizers
    "IndexedDataset": "indexed_dataset",
    "IndexedDatasetBuilder": "indexed_dataset",
    "IndexedFileError": "indexed_format",
    "write_indexed_dataset": "indexed_dataset",
    "Tokenizer": "tokenizer",
    "ByteLevelTokenizer": "tokenizer",
    "GPT2BPETokenizer": "tokenizer",
    "HuggingFaceTokenizer": "tokenizer",
    "TiktokenTokenizer": "tokenizer",
    "build_tokenizer": "tokenizer",
    "find_gpt2_bpe_files": "tokenizer",
    "merge_indexed_datasets": "indexed_dataset",
    "preprocess_documents": "preprocess",
    "PreprocessSummary": "preprocess",
    "PreprocessError": "preprocess_encoding",
    # GPT packing and blending
    "GPTDataset": "gpt_dataset",
    "BlendedDataset": "blended_dataset",
    "GPTDatasetConfig": "dataset_builder",
    "build_gpt_datasets": "dataset_builder",
    "parse_blend": "dataset_builder",
    "MockGPTLowLevelDataset": "mock_gpt",
    "parse_split": "splits",
    "split_document_ranges": "splits",
    "CacheRebuildWarning": "index_cache",
    # samplers and loaders
    "MegatronPretrainingSampler": "samplers",
    "MegatronPretrainingRandomSampler": "samplers",
    "MegatronDataSampler": "data_sampler",
    "WrappedDataLoader": "loader",
    "MegatronDataModule": "datamodule",
    "MegatronPretrainingBatchSampler": "samplers",
    "SamplerConfigError": "samplers",
    "NumMicroBatchesCalculator": "microbatches",
    "ConstantNumMicroBatchesCalculator": "microbatches",
    "RampupBatchsizeNumMicroBatchesCalculator": "microbatches",
    "build_num_microbatches_calculator": "microbatches",
    "MicroBatchConfigError": "microbatches",
    "PAD": "padding",
    "PaddingIndex": "padding",
    "PaddedDataset": "padding",
    "DataExhaustedError": "loader",
    "LoaderStateError": "loader",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

"""Supervised fine-tuning data: chat and prompt-completion rows, loss masks, packing.

:func:`read_sft_rows` reads JSONL / Parquet / ``save_to_disk`` rows,
:func:`tokenize_sft_rows` turns them into ``input_ids`` and ``loss_mask`` equal to
TRL's ``SFTTrainer``'s, :func:`sft_loss` is the token-mean loss over them, and
:class:`PackedSFTDataset` packs them into fixed-length samples with per-row attention
(:class:`SFTDataset`: one row a sample); :mod:`~epochal.data.sft.chat` renders a chat
prompt and finds the end-of-turn tokens for generation. :func:`build_sft_datasets`
tokenizes each file once, a row at a time, into a cached Megatron ``.bin``/``.idx``
token store that every process maps (:func:`tokenized_rows`, :class:`TokenizedRows`).
Names are loaded lazily from their defining modules.
"""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "ROLES": "rows",
    "SFTDataError": "rows",
    "SFTRow": "rows",
    "check_rows_path": "rows",
    "iter_sft_rows": "rows",
    "read_sft_rows": "rows",
    "rows_from_records": "rows",
    "split_sft_rows": "rows",
    "LOSS_ON": "tokenize",
    "OVERLENGTH": "tokenize",
    "SFTExample": "tokenize",
    "SFTReport": "tokenize",
    "SFTTokenized": "tokenize",
    "has_generation_markers": "tokenize",
    "load_chat_tokenizer": "tokenize",
    "tokenize_sft_row": "tokenize",
    "tokenize_sft_rows": "tokenize",
    "IGNORE_INDEX": "loss",
    "count_loss_tokens": "loss",
    "shift_labels": "loss",
    "sft_loss": "loss",
    "sft_loss_sum": "loss",
    "CHAT_TOKENIZER_FILES": "chat",
    "END_OF_TURN_TOKENS": "chat",
    "chat_prompt_ids": "chat",
    "chat_tokenizer_files": "chat",
    "end_of_turn_ids": "chat",
    "has_chat_template": "chat",
    "token_ids": "chat",
    "check_chat_template": "tokenizer_folder",
    "check_tokenizer_folder": "tokenizer_folder",
    "custom_code_entries": "tokenizer_folder",
    "TokenizedRows": "token_store",
    "tokenized_rows": "row_cache",
    "SFTDatasets": "build",
    "build_sft_datasets": "build",
    "PackedSFTDataset": "packing",
    "PackingReport": "packing",
    "SFTDataset": "packing",
    "best_fit_bins": "packing",
    "collate_packed": "packing",
    "cu_seqlens_from_positions": "packing",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

"""Protein inputs and ESM-2 pretraining samples (BioNeMo's layout and semantics).

- :mod:`.sequences`: what a sequence may contain (upper-casing, ``X B U Z O``, a final
  ``*``, no non-ASCII) and how long it may be (``EPOCHAL_MAX_PROTEIN_LENGTH``);
- :mod:`.text_lines`: bounded, UTF-8-checked lines of plain or gzipped text files;
- :mod:`.tables`: the one CSV/TSV/parquet reader (trailing delimiters, bounds) of every table;
- :mod:`.readers`: FASTA (plain/gz), CSV/TSV/parquet tables, MMseqs2 cluster TSVs;
- :mod:`.database`: BioNeMo's SQLite ``protein(id, sequence)`` store;
- :mod:`.layout`: cluster parquets and the FASTA/table -> SQLite + parquet converter;
- :mod:`.esm_dataset`: :class:`ESMMaskedResidueDataset`, BioNeMo's samples exactly;
- :mod:`.esm_builders`: ``create_train_dataset`` / ``create_valid_dataset`` / ``build_esm_datasets``;
- :mod:`.collate`: BioNeMo's padding collate for batches of samples;
- :mod:`.aaanalysis_data`: real sequences from the optional ``aaanalysis`` package.
"""

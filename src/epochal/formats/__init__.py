"""Checkpoint formats that both the trainer and the converters read and write.

- :mod:`epochal.formats.hf`: Hugging Face folders (``config.json``, safetensors or
  ``pytorch_model.bin`` weights, tokenizer files) as our models' ``(ModelConfig,
  state_dict)``, one module per model family; the trainer reads encoders with them for
  ``checkpoint.init_from``;
- :mod:`epochal.formats.common`: :class:`~epochal.formats.common.ConversionError` and the
  shape, key and vocabulary helpers every format shares;
- :mod:`epochal.formats.safe_load`: ``torch.load`` without arbitrary pickle, safetensors;
- :mod:`epochal.formats.bounded_parse`: JSON / YAML read with size and depth limits;
- :mod:`epochal.formats.checked_config`: a checkpoint's configuration fields checked by
  kind and range before a reader uses them.

This layer sits below ``train`` and ``convert`` and imports neither (only ``model``,
``data`` and the package's base helpers).
"""

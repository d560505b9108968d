"""``epochal._lazy``: a package's public names, imported from their modules on first access."""

from __future__ import annotations

import pytest

from epochal._lazy import lazy_exports, module_path


def test_an_entry_is_a_submodule_or_a_full_name():
    assert module_path("epochal.convert", "megatron.legacy") == "epochal.convert.megatron.legacy"
    assert module_path("epochal.convert", "epochal.formats.hf.io") == "epochal.formats.hf.io"


def test_names_resolve_to_their_defining_modules():
    getattr_, dir_ = lazy_exports(
        "epochal.convert", {"ConversionError": "epochal.formats.common", "x": "megatron.legacy"}
    )
    from epochal.formats.common import ConversionError

    assert getattr_("ConversionError") is ConversionError
    assert dir_() == ["ConversionError", "x"]
    with pytest.raises(AttributeError, match="'epochal.convert' has no attribute 'missing'"):
        getattr_("missing")


def test_convert_exports_the_formats_readers():
    import epochal.convert
    from epochal.formats.hf.io import load_hf_checkpoint, save_hf_checkpoint
    from epochal.formats.safe_load import UnsafeCheckpointError, safe_torch_load

    assert epochal.convert.load_hf_checkpoint is load_hf_checkpoint
    assert epochal.convert.save_hf_checkpoint is save_hf_checkpoint
    assert epochal.convert.safe_torch_load is safe_torch_load
    assert epochal.convert.UnsafeCheckpointError is UnsafeCheckpointError
    for name in epochal.convert.__all__:
        assert getattr(epochal.convert, name) is not None

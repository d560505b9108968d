"""Write-then-rename helpers shared by every layer."""

from __future__ import annotations

import pytest

from epochal._atomic import atomic_directory, atomic_path, atomic_write, replace_directory


def test_atomic_write_replaces_and_leaves_no_temporaries(tmp_path):
    target = tmp_path / "state.json"
    atomic_write(target, "old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "x.npy"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        assert tmp.suffix == ".npy" and tmp.parent == tmp_path
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.npy"]


def test_directories_swap_whole(tmp_path):
    final = tmp_path / "out"
    with atomic_directory(final) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(FileExistsError, match="overwrite"):
        with atomic_directory(final):
            pass
    with pytest.raises(KeyError), atomic_directory(final, overwrite=True) as tmp:
        (tmp / "b").write_text("2")
        raise KeyError("crash")
    assert [p.name for p in final.iterdir()] == ["a"]  # untouched by the failed attempt
    new = tmp_path / "new"
    new.mkdir()
    (new / "c").write_text("3")
    replace_directory(new, final)
    assert [p.name for p in final.iterdir()] == ["c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_files_get_the_mode_of_a_plain_open_whatever_the_writer(tmp_path):
    import os
    import stat

    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    (tmp_path / "plain").write_text("x")
    plain_mode = stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)
    with atomic_path(tmp_path / "model.safetensors") as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp))  # its writer creates 0600 files
    assert stat.S_IMODE(os.stat(tmp_path / "model.safetensors").st_mode) == plain_mode

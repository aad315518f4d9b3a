"""Only libraries this user wrote in a directory no one else can write are signed into the compile cache.

Inductor's default cache directory is ``<tmp>/torchinductor_<user>``, created with ``os.makedirs(...,
exist_ok=True)`` and never checked: another local user can create it first, or write into it, and plant a
library under a name the cache signs (a vector-ISA probe's, found by its source's content). Signed, that
library would be restored into a fresh directory and loaded by later runs."""

from __future__ import annotations

import json
import os
import platform

import pytest

from ort_torch_train.torch_internals import inductor_module
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.cache_store import CacheStore, RefusedEntry, platform_fingerprint

OTHER_UID = 54321


def plant_probe_library(root, owner: int | None = None) -> str:
    """A vector-ISA probe's source and a "library" beside it, as inductor's probe leaves them; its name."""
    program = inductor_module("cpu_vec_isa").VecISA._avx_code
    folder = root / "zz"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cprobe.cpp").write_text(program)
    (folder / "cprobe.so").write_bytes(b"\x7fELF planted")
    if owner is not None:
        os.chown(folder / "cprobe.so", owner, owner)
    return "zz/cprobe.so"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_a_library_of_another_user_or_in_a_folder_others_can_write_is_never_signed(tmp_path, monkeypatch, caplog):
    store = CacheStore(tmp_path / "cache")
    shared = tmp_path / "torchinductor_shared"
    shared.mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))

    name = plant_probe_library(shared, owner=OTHER_UID)  # another user's file in this user's folder
    CompileCache(store).save_libraries()
    assert not store.contains("library", name, platform_fingerprint())
    assert "not signing" in caplog.text

    os.chown(shared / name, os.geteuid(), os.getegid())
    os.chmod(shared, 0o777)  # a folder anyone can write: any file in it may have been swapped
    CompileCache(store).save_libraries()
    assert not store.contains("library", name, platform_fingerprint())

    os.chmod(shared, 0o755)  # this user's own file in this user's private folder: signed as before
    CompileCache(store).save_libraries()
    assert store.contains("library", name, platform_fingerprint())


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the vector-ISA probe is saved on x86 only")
def test_a_damaged_vector_isa_probe_entry_is_written_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    store = CacheStore(tmp_path / "cache")
    CompileCache(store).save_vector_isa_probe()
    path = store.path_of("isa", "probe", platform_fingerprint())
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01  # a flipped bit in the payload: the signature fails
    path.write_bytes(bytes(data))
    with pytest.raises(RefusedEntry, match="fails its signature"):
        store.read("isa", "probe", platform_fingerprint())

    CompileCache(store).save_vector_isa_probe()
    header, payload = store.read("isa", "probe", platform_fingerprint())
    reported, working = json.loads(payload)
    assert header["kind"] == "isa" and isinstance(reported, list) and isinstance(working, list)


def test_a_damaged_library_entry_is_written_again(tmp_path, monkeypatch):
    inductor = tmp_path / "inductor"
    inductor.mkdir(mode=0o700)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    store = CacheStore(tmp_path / "cache")
    name = plant_probe_library(inductor)
    CompileCache(store).save_libraries()
    path = store.path_of("library", name, platform_fingerprint())
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01  # a flipped bit in the payload: the signature fails
    path.write_bytes(bytes(data))
    with pytest.raises(RefusedEntry, match="fails its signature"):
        store.read("library", name, platform_fingerprint())

    CompileCache(store).save_libraries()
    assert store.read("library", name, platform_fingerprint())[1] == b"\x7fELF planted"  # type: ignore[index]

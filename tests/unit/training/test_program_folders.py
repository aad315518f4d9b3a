"""A compiled program is a folder (``training/package/programs.py``): an archive unpacked whole or not at all in place
of the folder there, its bytes checked as untrusted input (a compile cache's entry), and packed back as it was."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from ort_torch_train.errors import PackageError, PathOutsideError
from ort_torch_train.training.package import programs
from ort_torch_train.training.package.programs import pack_program, unpack_program

FILES = {"archive/archive_format": b"pt2", "archive/data/aotinductor/model/a.wrapper.so": bytes(range(256)) * 4}


def _archive(files: dict[str, bytes]) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return data.getvalue()


def _files(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def test_a_program_unpacks_in_place_of_the_folder_there_and_packs_back(tmp_path: Path) -> None:
    folder = tmp_path / "train_step"
    folder.mkdir()
    (folder / "stale.so").write_bytes(b"an older build")
    unpack_program(_archive(FILES), folder)
    assert _files(folder) == FILES
    again = tmp_path / "again"
    unpack_program(pack_program(folder), again)
    assert _files(again) == FILES
    assert sorted(path.name for path in tmp_path.iterdir()) == ["again", "train_step"]  # no temp folder left


@pytest.mark.parametrize(
    ("archive", "error", "named"),
    [
        (b"not a zip archive", PackageError, "expected a zip archive"),
        (_archive({"../outside.so": b"x"}), PathOutsideError, "'../outside.so' leaves the folder"),
        (_archive({"/etc/cron.d/job": b"x"}), PathOutsideError, "'/etc/cron.d/job' leaves the folder"),
        (_archive({"big.so": bytes(2048)}), PackageError, "unpacks to 2048 bytes, over 1100"),
    ],
)
def test_a_bad_archive_is_refused_naming_why_and_the_folder_there_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive: bytes, error: type[Exception], named: str
) -> None:
    monkeypatch.setattr(programs, "UNPACKED_LIMIT", 1100)
    folder = tmp_path / "program"
    unpack_program(_archive(FILES), folder)
    with pytest.raises(error, match=named.replace("(", r"\(")) as raised:
        unpack_program(archive, folder)
    assert "program" in str(raised.value)
    assert _files(folder) == FILES and sorted(tmp_path.iterdir()) == [folder]
    assert not (tmp_path.parent / "outside.so").exists()


def test_a_file_where_the_program_folder_goes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "program").write_bytes(b"a file")
    with pytest.raises(ValueError, match="expected a folder or nothing, got a file or link"):
        unpack_program(_archive(FILES), tmp_path / "program")
    assert (tmp_path / "program").read_bytes() == b"a file" and len(list(tmp_path.iterdir())) == 1

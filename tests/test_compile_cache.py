"""save/load_compile_cache: a missing file is 'nothing cached yet', a foreign file a clear error."""

import pytest

from ort_torch_train.errors import InputError
from ort_torch_train.training.compile_cache import load_compile_cache, save_compile_cache


def test_a_missing_cache_file_loads_nothing(tmp_path):
    assert load_compile_cache(tmp_path / "compile.cache") is False


def test_a_file_that_is_not_a_compile_cache_is_rejected_by_name(tmp_path):
    path = tmp_path / "compile.cache"
    path.write_bytes(b"not a cache")
    with pytest.raises(InputError, match="compile.cache"):
        load_compile_cache(path)


def test_saving_with_nothing_compiled_writes_a_loadable_file_or_nothing(tmp_path):
    path = tmp_path / "compile.cache"
    written = save_compile_cache(path)
    assert (written == 0 and not path.exists()) or (path.stat().st_size == written and load_compile_cache(path))

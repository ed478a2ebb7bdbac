"""quantcore's cache and data folders: the environment variables that move them must name absolute folders."""

from __future__ import annotations

import pytest

from quantcore import ConfigError, QuantcoreError, userdirs


@pytest.mark.parametrize("env, folder", [(userdirs.CACHE_ENV, userdirs.cache_dir),
                                         (userdirs.DATA_ENV, userdirs.data_dir)])
def test_a_folder_variable_must_be_absolute(env, folder, monkeypatch, tmp_path):
    monkeypatch.setenv(env, str(tmp_path))
    assert folder() == tmp_path
    monkeypatch.setenv(env, "relative/cache")
    with pytest.raises(ConfigError, match=f"{env}='relative/cache' is a relative path; set it to an absolute"):
        folder()
    assert issubclass(ConfigError, QuantcoreError) and issubclass(ConfigError, ValueError)
    monkeypatch.setenv(env, "")  # empty: unset
    assert folder().is_absolute()

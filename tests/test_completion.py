"""The DONE marker: what changes the fingerprint, and atomic writing."""

from omegaconf import OmegaConf

from kvbench.tables.done_marker import DONE_NAME, config_fingerprint, is_done, mark_done


def _cfg(**values):
    return OmegaConf.create({"seed": 0, "progress": True, "skip_done": True, "model": {"n": 1},
                             **values})  # fmt: skip


def test_fingerprint_ignores_reporting_keys_but_not_settings():
    base = config_fingerprint(_cfg())
    assert config_fingerprint(_cfg(progress=False, skip_done=False)) == base
    assert config_fingerprint(_cfg(seed=1)) != base
    assert config_fingerprint(_cfg(model={"n": 2})) != base


def test_done_only_for_the_same_fingerprint(tmp_path):
    assert not is_done(tmp_path, "abc")
    mark_done(tmp_path, "abc", wall_s=1.5)
    assert is_done(tmp_path, "abc")
    assert not is_done(tmp_path, "other")
    assert [p.name for p in tmp_path.iterdir()] == [DONE_NAME]  # no temporary file left


def test_a_corrupt_marker_is_not_done(tmp_path):
    (tmp_path / DONE_NAME).write_text("{not json")
    assert not is_done(tmp_path, "abc")

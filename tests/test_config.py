"""Options: every setting comes from ``TILEFUSE_<NAME>`` when an Options is constructed."""

from tilefuse.config import Options

C = {"kind": "c"}


def test_options_read_the_environment_when_constructed(monkeypatch):
    monkeypatch.delenv("TILEFUSE_TUNE", raising=False)
    monkeypatch.delenv("TILEFUSE_EAGER_TAIL", raising=False)
    monkeypatch.delenv("TILEFUSE_MEASURE", raising=False)  # tests/conftest.py sets it to 0 for the session
    before = Options(target=C)
    assert before.tune == "none" and before.eager_tail and before.channels_last and before.measure
    monkeypatch.setenv("TILEFUSE_TUNE", "fast")  # set after tilefuse.config was imported: it counts
    monkeypatch.setenv("TILEFUSE_EAGER_TAIL", "0")
    monkeypatch.setenv("TILEFUSE_CHANNELS_LAST", "0")
    monkeypatch.setenv("TILEFUSE_MEASURE", "0")
    monkeypatch.setenv("TILEFUSE_TUNE_SECONDS", "12.5")
    after = Options(target=C)
    assert (after.tune, after.eager_tail, after.channels_last, after.measure, after.tune_seconds) == \
        ("fast", False, False, False, 12.5)
    assert Options(target=C, tune="max").tune == "max"  # an explicit argument wins over the environment
    assert before.tune == "none"  # options already made keep what they read

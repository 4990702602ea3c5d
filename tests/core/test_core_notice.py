"""Notices before slow steps, and other libraries' progress bars kept off the console."""

from __future__ import annotations

import io

import pytest
from skyrl_core.notice import SLOW_STEP_S, announce, announce_slow_step, format_duration, quiet_progress_bars


def test_durations_read_as_rough_times():
    assert [format_duration(s) for s in (0.2, 4.4, 59, 61, 150, 5400)] == ["1 s", "4 s", "59 s", "1 min", "2 min", "1.5 h"]


def test_a_notice_is_one_line_with_the_expected_time():
    out = io.StringIO()
    announce("building the index of c.jsonl", 125, source="skyrl-search", stream=out)
    assert out.getvalue() == "skyrl-search: building the index of c.jsonl (about 2 min)\n"
    assert announce_slow_step("fast", SLOW_STEP_S / 2, stream=out) is False
    assert announce_slow_step("slow", SLOW_STEP_S, stream=out) is True
    assert out.getvalue().splitlines()[1:] == ["skyrl: slow (about 3 s)"]


def test_quiet_progress_bars_silences_every_tqdm_bar_and_restores_them():
    tqdm = pytest.importorskip("tqdm")
    from tqdm.auto import tqdm as auto_tqdm

    def draw(cls) -> str:
        out = io.StringIO()
        for _ in cls(range(3), file=out, desc="bar", mininterval=0):
            pass
        return out.getvalue()

    with quiet_progress_bars():
        assert draw(tqdm.tqdm) == "" and draw(auto_tqdm) == ""
    assert "bar" in draw(tqdm.tqdm) and "bar" in draw(auto_tqdm)

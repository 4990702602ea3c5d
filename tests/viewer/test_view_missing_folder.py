"""``skyrl view`` on a path that is not a folder says so on the console and exits non-zero instead of
serving an empty page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SKYRL = Path(sys.executable).with_name("skyrl")


def _view(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SKYRL), "view", *args, "--port", "0"], capture_output=True, text=True, timeout=60)


def test_a_missing_folder_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "runs" / "reverse_text-typo"
    result = _view(str(missing))
    assert result.returncode == 2
    assert f"error: {missing} does not exist" in result.stderr
    assert "serving" not in result.stdout


def test_a_file_or_one_missing_folder_among_good_ones_is_refused_too(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    (good / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    a_file = tmp_path / "metrics.jsonl"
    a_file.write_text("")
    result = _view(str(good), str(a_file), str(tmp_path / "gone"), "--export", str(tmp_path / "page.html"))
    assert result.returncode == 2
    assert f"{a_file} is not a folder" in result.stderr and f"{tmp_path / 'gone'} does not exist" in result.stderr
    assert str(good) not in result.stderr
    assert not (tmp_path / "page.html").exists()  # nothing written before the error

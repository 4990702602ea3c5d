"""Task datasets: folders of tasks, and Parquet files of tar archives extracted as hostile input."""

from __future__ import annotations

import io
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest
from skyrl_harbor_terminal.dataset import (
    MARKER,
    DatasetError,
    extract_parquet,
    find_task_dirs,
    load_tasks,
)
from task_fixtures import write_task

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def archive(task_dir: Path | None = None, extra: list[tuple[tarfile.TarInfo, bytes | None]] = (),
            compression: str = "gz") -> bytes:
    """A tar (gzip by default) of ``task_dir``'s contents, as Harbor packs them, then ``extra`` members."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compression}") as tar:
        if task_dir is not None:
            tar.add(task_dir, arcname=".")
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(name: str, data: bytes = b"x", **fields) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if fields.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data if info.size else None


def write_parquet(path: Path, rows: list[tuple[str, bytes]], columns: tuple[str, str] = ("path", "task_binary")) -> Path:
    table = pa.table({columns[0]: pa.array([r[0] for r in rows], pa.string()),
                      columns[1]: pa.array([r[1] for r in rows], pa.binary())})
    pq.write_table(table, path)
    return path


def files_outside(root: Path, extract_dir: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if extract_dir not in p.parents and p != extract_dir}


@pytest.fixture()
def sources(tmp_path: Path) -> Path:
    """Two real task folders to archive (outside the extraction folder)."""
    root = tmp_path / "sources"
    write_task(root, "hello-file")
    write_task(root, "count-lines", extra={"tests/helper.py": "print(1)\n"})
    (root / "hello-file" / "tests" / "test.sh").chmod(0o4755)  # setuid must not survive extraction
    return root


def test_folder_of_tasks_loads_sorted(sources: Path) -> None:
    (sources / "notes").mkdir()  # a subfolder without task.toml is not a task
    assert [t.name for t in load_tasks(sources)] == ["count-lines", "hello-file"]
    assert find_task_dirs(sources / "hello-file") == [sources / "hello-file"]


def test_folder_without_tasks_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=f"{tmp_path}: no Harbor tasks found"):
        find_task_dirs(tmp_path)
    with pytest.raises(DatasetError, match="neither a folder of Harbor tasks nor a .parquet dataset"):
        load_tasks(tmp_path / "tasks.csv")


def test_parquet_dataset_extracts_and_loads(tmp_path: Path, sources: Path) -> None:
    dataset = write_parquet(tmp_path / "tb.parquet", [
        ("hello-file", archive(sources / "hello-file")),
        ("count-lines", archive(sources / "count-lines", compression="")),  # an uncompressed tar works too
    ])
    extract_dir = tmp_path / "extracted"
    tasks = load_tasks(dataset, extract_dir=extract_dir)
    assert [t.name for t in tasks] == ["hello-file", "count-lines"]  # row order
    assert [t.path for t in tasks] == [extract_dir / "hello-file", extract_dir / "count-lines"]
    assert tasks[1].test_files(tasks[1].steps[0])["helper.py"] == b"print(1)\n"
    test_sh = extract_dir / "hello-file" / "tests" / "test.sh"
    assert stat.S_IMODE(test_sh.stat().st_mode) == 0o755
    assert stat.S_IMODE((extract_dir / "hello-file" / "tests").stat().st_mode) == 0o755
    assert sorted(p.name for p in extract_dir.iterdir()) == ["count-lines", "hello-file"]  # no staging left


def test_extracted_tasks_are_reused_until_the_archive_changes(tmp_path: Path, sources: Path) -> None:
    extract_dir = tmp_path / "extracted"
    dataset = write_parquet(tmp_path / "tb.parquet", [("hello-file", archive(sources / "hello-file"))])
    extract_parquet(dataset, extract_dir)
    sentinel = extract_dir / "hello-file" / "sentinel"
    sentinel.write_text("still here")
    assert extract_parquet(dataset, extract_dir) == [extract_dir / "hello-file"]
    assert sentinel.exists()
    (sources / "hello-file" / "instruction.md").write_text("A new instruction.\n")
    write_parquet(dataset, [("hello-file", archive(sources / "hello-file"))])
    (task,) = load_tasks(dataset, extract_dir=extract_dir)
    assert task.steps[0].instruction == "A new instruction.\n" and not sentinel.exists()


def test_default_extract_dir_is_a_cache_keyed_by_file_content(tmp_path: Path, sources: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYRL_HARBOR_CACHE", str(tmp_path / "cache"))
    dataset = write_parquet(tmp_path / "tb.parquet", [("hello-file", archive(sources / "hello-file"))])
    (task_dir,) = extract_parquet(dataset)
    assert task_dir.parent.parent == tmp_path / "cache"
    assert task_dir.parent.name.startswith("tb-") and len(task_dir.parent.name) == len("tb-") + 12
    assert (task_dir / MARKER).is_file()


ATTACKS = {
    "parent-traversal": ([member("../evil", b"pwned")], {}, "'../evil'"),
    "absolute-name": ([member("{outside}/passwd", b"root::0:0::/:/bin/sh")], {}, "/passwd'"),
    "symlink-to-etc": ([member("etc", type=tarfile.SYMTYPE, linkname="/etc")], {}, "'etc': links are not allowed"),
    "hardlink": ([member("link", type=tarfile.LNKTYPE, linkname="task.toml")], {}, "'link': links are not allowed"),
    "fifo": ([member("pipe", type=tarfile.FIFOTYPE)], {}, "'pipe': only regular files and folders"),
    "device": ([member("sda", type=tarfile.BLKTYPE)], {}, "'sda': only regular files and folders"),
    "duplicate-member": ([member("data.txt"), member("data.txt")], {}, "'data.txt': appears twice"),
    "declared-too-big": ([member("big.bin", bytes(10_000_001))], {"max_task_bytes": 10_000_000},
                         "'big.bin': the task would exceed 10000000 bytes"),
    "too-many-members": ([member(f"f{i}.txt") for i in range(30)], {"max_members": 20},
                         "the archive has more than 20 members"),
    "gzip-bomb": ([member(f"zeros{i}.bin", bytes(1024 * 1024)) for i in range(3)], {"max_task_bytes": 2_500_000},
                  "'zeros2.bin': the task would exceed 2500000 bytes"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_hostile_archives_are_refused_and_nothing_escapes(tmp_path: Path, sources: Path, attack: str) -> None:
    members, limits, message = ATTACKS[attack]
    outside = tmp_path / "outside"
    for info, _ in members:
        info.name = info.name.format(outside=outside)
    hostile = archive(sources / "count-lines", members)
    if attack == "gzip-bomb":
        assert len(hostile) < 50_000  # 3 MiB of content in a few kB
    dataset = write_parquet(tmp_path / "tb.parquet", [("hello-file", archive(sources / "hello-file")),
                                                      ("bad-task", hostile)])
    extract_dir = tmp_path / "work" / "extracted"
    extract_dir.parent.mkdir()
    before = files_outside(tmp_path, extract_dir)
    with pytest.raises(DatasetError) as info:
        load_tasks(dataset, extract_dir=extract_dir, **limits)
    text = str(info.value)
    assert "row 1 (path 'bad-task')" in text and "archive member" in text and message in text
    assert files_outside(tmp_path, extract_dir) == before
    assert not outside.exists()
    assert sorted(p.name for p in extract_dir.iterdir()) == ["hello-file"]  # no half task, no staging folder
    assert (extract_dir / "hello-file" / MARKER).is_file()


@pytest.mark.parametrize(("path", "message"), [
    ("../x", "path must be a relative folder path"),
    ("/tmp/x", "path must be a relative folder path"),
    ("a/./b", "path must be a relative folder path"),
    ("", "path must be a non-empty string"),
])
def test_unsafe_row_paths_are_refused(tmp_path: Path, sources: Path, path: str, message: str) -> None:
    dataset = write_parquet(tmp_path / "tb.parquet", [("ok", archive(sources / "hello-file")),
                                                      (path, archive(sources / "count-lines"))])
    extract_dir = tmp_path / "work" / "extracted"
    extract_dir.parent.mkdir()
    before = files_outside(tmp_path, extract_dir)
    with pytest.raises(DatasetError, match=f"row 1 \\(path '{path}'\\): {message}"):
        load_tasks(dataset, extract_dir=extract_dir)
    assert files_outside(tmp_path, extract_dir) == before
    assert sorted(p.name for p in extract_dir.iterdir()) == ["ok"]


def test_duplicate_row_paths_are_refused(tmp_path: Path, sources: Path) -> None:
    blob = archive(sources / "hello-file")
    dataset = write_parquet(tmp_path / "tb.parquet", [("a", blob), ("b", blob), ("a", blob)])
    with pytest.raises(DatasetError, match=r"row 2 \(path 'a'\): duplicate path, already used by row 0"):
        load_tasks(dataset, extract_dir=tmp_path / "extracted")


@pytest.mark.parametrize("order", [("a", "a/b"), ("a/b", "a")])
def test_task_folders_may_not_nest(tmp_path: Path, sources: Path, order: tuple[str, str]) -> None:
    blob = archive(sources / "hello-file")
    dataset = write_parquet(tmp_path / "tb.parquet", [(order[0], blob), (order[1], blob)])
    with pytest.raises(DatasetError, match=f"row 1 \\(path '{order[1]}'\\): one task folder may not be nested"):
        load_tasks(dataset, extract_dir=tmp_path / "extracted")


def test_nested_row_paths_extract_below_the_folder(tmp_path: Path, sources: Path) -> None:
    dataset = write_parquet(tmp_path / "tb.parquet", [("suite/hello-file", archive(sources / "hello-file"))])
    (task,) = load_tasks(dataset, extract_dir=tmp_path / "extracted")
    assert task.path == tmp_path / "extracted" / "suite" / "hello-file"


def test_damaged_archive_is_an_error_naming_the_row(tmp_path: Path) -> None:
    dataset = write_parquet(tmp_path / "tb.parquet", [("junk", b"this is not a tar archive")])
    with pytest.raises(DatasetError, match=r"row 0 \(path 'junk'\): unreadable or damaged task archive"):
        load_tasks(dataset, extract_dir=tmp_path / "extracted")


def test_missing_columns_are_named_with_those_present(tmp_path: Path) -> None:
    dataset = write_parquet(tmp_path / "tb.parquet", [("a", b"")], columns=("name", "task_binary"))
    with pytest.raises(DatasetError, match="missing column\\(s\\) path; the columns present are name, task_binary"):
        load_tasks(dataset, extract_dir=tmp_path / "extracted")


def test_missing_pyarrow_names_the_extra_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = tmp_path / "tb.parquet"
    dataset.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install 'skyrl-harbor-terminal\[parquet\]'"):
        load_tasks(dataset, extract_dir=tmp_path / "extracted")


def test_archive_modes_are_sanitised(tmp_path: Path, sources: Path) -> None:
    data = archive(None, [member("task.toml", b'version = "1.0"\n', mode=0o6777),
                          member("secret", b"s", mode=0o000)])
    dataset = write_parquet(tmp_path / "tb.parquet", [("t", data)])
    (task_dir,) = extract_parquet(dataset, tmp_path / "extracted")
    assert stat.S_IMODE((task_dir / "task.toml").stat().st_mode) == 0o755
    assert stat.S_IMODE((task_dir / "secret").stat().st_mode) == 0o644
    assert os.access(task_dir / "secret", os.R_OK)

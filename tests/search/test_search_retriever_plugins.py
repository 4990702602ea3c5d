"""A retriever from another package (an entry point in ``skyrl_search.retrievers``) is usable as
``env.retriever.name`` and listed by ``skyrl plugins`` under skyrl-search's ``extensions``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from skyrl_search.retrieval import ENTRY_POINT_GROUP, make_retriever, retriever_names


def install_retriever_package(root: Path) -> None:
    """``skyrl-retriever-fixed`` 0.1.0 as pip would leave it in site-packages: its module and a dist-info
    folder whose entry point names the factory ``fixed``."""
    (root / "skyrl_retriever_fixed.py").write_text(textwrap.dedent("""
        from skyrl_search.retrieval import Passage

        class FixedRetriever:
            def retrieve(self, queries, topk):
                return [[Passage(id="1", title="Kesten", text="Kesten is a market town.", score=1.0)][:topk]
                        for _ in queries]

        def make(options):
            return FixedRetriever()
        """))
    info = root / "skyrl_retriever_fixed-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: skyrl-retriever-fixed\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfixed = skyrl_retriever_fixed:make\n")


def test_installed_retriever_is_usable_and_listed_by_skyrl_plugins(skyrl_cli, tmp_path, monkeypatch):
    install_retriever_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "fixed" in retriever_names()
    try:
        assert make_retriever("fixed").retrieve(["where is kesten"], topk=1)[0][0].title == "Kesten"
    finally:
        sys.modules.pop("skyrl_retriever_fixed", None)

    result = skyrl_cli("plugins")
    assert result.exit_code == 0, result.output
    (search,) = [p for p in json.loads(result.stdout) if p["name"] == "skyrl-search"]
    assert "entry_point_groups" in search["hooks"]
    assert search["extensions"] == {ENTRY_POINT_GROUP: [
        {"name": "fixed", "value": "skyrl_retriever_fixed:make", "provider": "skyrl-retriever-fixed",
         "version": "0.1.0"}]}


"""MkDocs hooks (mkdocs.yml ``hooks:``): add the generated pages to every build as virtual files.

The package pages (from the READMEs) and the reference pages (hooks, CLI, configuration) come from
docs/gen_reference.py. They are added in ``on_files``, before MkDocs builds the navigation and checks
links, so nothing is written into the tree and two builds never race on a folder.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.gen_reference")
_HERE = Path(__file__).resolve().parent


def _gen_reference() -> Any:
    """docs/gen_reference.py, imported by path (docs/ is not a package)."""
    name = "skyrl_docs_gen_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _HERE / "gen_reference.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def on_files(files: Files, config: Any) -> Files:
    gen = _gen_reference()
    root = Path(config.config_file_path).resolve().parent
    site = gen.generated_files(root)
    for src_uri, markdown in site.pages.items():
        files.append(File.generated(config, src_uri, content=markdown))
    for src_uri, path in site.assets.items():
        files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    for link in site.dropped_links:
        log.debug("link to a repository file kept as text: %s", link)
    for anchor in site.broken_anchors:
        log.info("README link to a heading that does not exist (linked to the page instead): %s", anchor)
    return files


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    """``mkdocs serve``: rebuild when a README or the generator changes."""
    gen = _gen_reference()
    root = Path(config.config_file_path).resolve().parent
    for readme in gen.PACKAGES.values():
        server.watch(str(root / readme))
    return server

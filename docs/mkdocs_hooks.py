"""MkDocs hooks (mkdocs.yml ``hooks:``): the generated reference pages, and links out of docs/.

The reference pages (hooks, CLI, configuration) come from docs/gen_reference.py. Their committed
copies in docs/reference/ are replaced in ``on_files``, before MkDocs builds the navigation and checks
links, by the pages generated from the installed code, so the site is current even where a
contributor has not rewritten them yet, and nothing is written into the tree during a build. The
other pages, the package pages included (docs/packages/<name>.md), are hand-written Markdown files of
docs/.

Those pages link to other repository files relatively (an image in ``viewer/docs/``, a source file),
so that the links work on GitHub too; :func:`gen_reference.outside_links` makes them work on the
site: an image is copied under ``assets/`` (added here in ``on_files``), a link to another file keeps
only its text (``on_page_markdown``), and a link to a file that does not exist is a warning.
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


def _root_and_docs_dir(config: Any) -> tuple[Path, str]:
    root = Path(config.config_file_path).resolve().parent
    return root, Path(config.docs_dir).resolve().relative_to(root).as_posix()


def on_files(files: Files, config: Any) -> Files:
    gen = _gen_reference()
    root, docs_dir = _root_and_docs_dir(config)
    assets: dict[str, Path] = {}
    for file in files.documentation_pages():
        assets.update(gen.outside_links(file.content_string, file.src_uri, root, docs_dir).assets)
    for src_uri, markdown in gen.generated_files().items():
        committed = files.get_file_from_path(src_uri)
        if committed is not None:
            files.remove(committed)
        files.append(File.generated(config, src_uri, content=markdown))
    for src_uri, path in assets.items():
        files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    gen = _gen_reference()
    root, docs_dir = _root_and_docs_dir(config)
    links = gen.outside_links(markdown, page.file.src_uri, root, docs_dir)
    for link in links.kept_as_text:
        log.debug("link to a repository file the site does not have, kept as text: %s", link)
    for link in links.missing:
        log.warning("link to a file that does not exist: %s", link)
    return links.markdown

"""The documentation site (mkdocs.yml, docs/): the strict build passes and the generated reference is complete.

The completeness checks are the ``undocumented_*`` functions of docs/gen_reference.py, run here on the
installed hookspecs, CLI and config classes, and once each on a fixture that lacks documentation, to
show that they report what is missing. Every package (a folder with a ``pyproject.toml``) has a page
``docs/packages/<folder name>.md``, and its README stays short and links to that page.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pluggy
import pytest
import typer
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_PAGES = ROOT / "docs" / "packages"
README_MAX_LINES = 100  # a package README is a first look; the details are on its docs page
# Every distribution of the repository: its folder's name is the name of its docs page.
PACKAGES = {path.parent.name: path.parent for pattern in ("*/pyproject.toml", "*/*/pyproject.toml")
            for path in sorted(ROOT.glob(pattern)) if not path.parent.name.startswith(".")}


def _load_gen_reference() -> types.ModuleType:
    name = "skyrl_docs_gen_reference_under_test"
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


gen = _load_gen_reference()


def _problems(problems: list[str]) -> str:
    return f"{len(problems)} undocumented:\n" + "\n".join(problems)


# -- the build -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_strict_build_passes(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert not re.search(r"^(WARNING|ERROR)\b", output, re.MULTILINE), output
    for page in ["index", "concepts", "plugin-guide", "contributing", *(f"packages/{name}" for name in PACKAGES),
                 "reference/hooks", "reference/cli", "reference/configuration"]:
        assert (site / f"{page}.html").is_file(), page
    hooks = (site / "reference" / "hooks.html").read_text()
    assert "register_envs" in hooks and "on_train_step_end" in hooks
    assert "skyrl check" in (site / "reference" / "cli.html").read_text()
    assert "trainer.lr" in (site / "reference" / "configuration.html").read_text()
    assert (site / "assets" / "viewer" / "docs" / "metrics.png").is_file()  # an image a package page shows
    assert 'src="../assets/viewer/docs/metrics.png"' in (site / "packages" / "viewer.html").read_text()


def test_the_committed_reference_pages_name_what_the_code_has():
    """docs/reference/ is what GitHub and editors show; the site is built from fresh pages. A hook,
    command, option or config field added, renamed or removed without rewriting the pages fails here."""
    for site_path, markdown in gen.generated_files().items():
        committed = ROOT / "docs" / site_path
        assert committed.is_file(), f"{committed} is missing: run python docs/gen_reference.py docs"
        fresh, old = gen.reference_outline(markdown), gen.reference_outline(committed.read_text(encoding="utf-8"))
        assert len(fresh) > 20
        assert fresh == old, (f"{committed} is out of date (run python docs/gen_reference.py docs): missing "
                              f"{sorted(fresh - old)[:10]}, no longer there {sorted(old - fresh)[:10]}")


def test_the_reference_outline_sees_a_new_option_and_a_new_field():
    page = "## `skyrl run` {#skyrl-run}\n\n    --steps  INTEGER\n| <code>trainer.lr</code> | float |\n"
    outline = gen.reference_outline(page)
    assert outline == {"## `skyrl run` {#skyrl-run}", "--steps", "| <code>trainer.lr</code>"}
    assert gen.reference_outline(page + "    --resume  TEXT\n") != outline
    assert gen.reference_outline(page.replace("trainer.lr", "trainer.steps")) != outline


# -- completeness of the real reference ------------------------------------------------------------------


def test_every_hookspec_has_a_docstring_in_the_hook_reference():
    from skyrl_core import hookspecs

    specs = gen.hookspecs(hookspecs)
    assert {fn.__name__ for fn in specs} >= {"register_envs", "register_probes", "register_commands",
                                             "on_rollout_end"}
    assert gen.undocumented_hooks(hookspecs) == [], _problems(gen.undocumented_hooks(hookspecs))
    page = gen.hooks_page(hookspecs)
    for fn in specs:
        assert f"def {fn.__name__}(" in page
        assert gen.docstring_markdown(fn.__doc__.strip().splitlines()[0]) in page


def test_every_cli_command_has_help_text(skyrl_plugin_manager):
    from skyrl_core.cli import build_app

    app = build_app()
    paths = [doc.path for doc in gen.walk_commands(app)]
    assert {"skyrl", "skyrl run", "skyrl check", "skyrl new env"} <= set(paths)
    problems = gen.undocumented_commands(app)
    assert problems == [], _problems(problems)
    page = gen.cli_page(build_app())
    for path in paths:
        assert f"Usage: {path} " in page, path


def test_every_config_field_of_every_registered_component_has_a_description(skyrl_plugin_manager):
    models = gen.config_models(skyrl_plugin_manager.registry)
    assert {"env reverse_text", "generator default", "engine openai", "run"} <= set(models)
    problems = gen.undocumented_fields(models)
    assert problems == [], _problems(problems)


# -- the checks report what is missing -------------------------------------------------------------------


def test_an_undocumented_hookspec_is_reported():
    module = types.ModuleType("fake_hookspecs")
    exec(textwrap.dedent('''
        import pluggy
        hookspec = pluggy.HookspecMarker("skyrl")

        @hookspec
        def register_things(register) -> None:
            """Register things."""

        @hookspec
        def on_thing_done(thing: int) -> None:
            pass

        def helper():  # not a hookspec: never reported
            pass
    '''), module.__dict__)
    assert isinstance(module.hookspec, pluggy.HookspecMarker)
    assert gen.undocumented_hooks(module) == ["hook on_thing_done has no docstring"]
    page = gen.hooks_page(module)
    assert "def register_things(register) -> None" in page and "def on_thing_done(thing: int) -> None" in page


def test_an_undocumented_command_option_or_argument_is_reported():
    app = typer.Typer(help="A test CLI.")

    @app.command()
    def documented(count: int = typer.Option(1, "--count", help="How many.")) -> None:
        """Do the documented thing."""

    @app.command()
    def bare(name: str = typer.Argument(...), flag: bool = typer.Option(False, "--flag")) -> None:
        pass

    group = typer.Typer()  # a sub-command group without help
    group.command("leaf", help="A documented leaf.")(lambda: None)
    app.add_typer(group, name="grp")

    assert gen.undocumented_commands(app, "tool") == [
        "command `tool bare` has no help text",
        "command `tool bare`: argument name has no help text",
        "command `tool bare`: option --flag has no help text",
        "command `tool grp` has no help text",
    ]
    page = gen.cli_page(app, "tool")
    assert "Usage: tool documented [OPTIONS]" in page and "How many." in page and "Usage: tool grp leaf" in page


def test_an_undocumented_config_field_is_reported_nested_ones_included():
    class Inner(BaseModel):
        depth: int = 1
        width: int = Field(2, description="Documented.")

    class FakeConfig(BaseModel):
        documented: int = Field(1, description="Has one.")
        inner: Inner = Field(default_factory=Inner, description="A nested model.")
        bare: str | None = None

    assert gen.undocumented_fields({"env fake": FakeConfig}) == [
        f"env fake: field inner.depth has no description (declared in {__name__}.{Inner.__qualname__})",
        f"env fake: field bare has no description (declared in {__name__}.{FakeConfig.__qualname__})",
    ]
    page = gen.config_page({"env fake": FakeConfig})
    assert "<code>env.inner.width</code> | <code>int</code> | <code>2</code> | Documented." in page
    assert "<code>env.bare</code> | <code>str &#124; None</code> | <code>None</code> | *(no description)*" in page


# -- package pages and READMEs --------------------------------------------------------------------------


def _links(markdown: str) -> list[str]:
    """Targets of the Markdown links outside fenced code blocks."""
    return [m.group(3) for code, chunk in gen._prose_chunks(markdown) if not code for m in gen._LINK.finditer(chunk)]


def _anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings, as the site (toc, pymdownx slugify, lower case) and GitHub make them."""
    from pymdownx.slugs import slugify

    slug, anchors = slugify(case="lower"), set()
    for code, chunk in gen._prose_chunks(markdown):
        for line in [] if code else chunk.splitlines():
            if (match := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
                text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)).replace("`", "").replace("*", "")
                anchor, n = slug(text, "-"), 0
                while (f"{anchor}_{n}" if n else anchor) in anchors:
                    n += 1
                anchors.add(f"{anchor}_{n}" if n else anchor)
    return anchors


def test_getting_started_shows_the_readme_quickstart_commands_verbatim():
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", quickstart, re.DOTALL)
    assert block is not None
    assert f"```bash\n{block.group(1)}```" in (ROOT / "docs" / "index.md").read_text()


def test_every_package_has_a_docs_page_in_the_nav():
    assert {"core", "trainers", "sandbox", "viewer", "reverse_text"} <= set(PACKAGES)
    assert {page.stem for page in PACKAGE_PAGES.glob("*.md")} == set(PACKAGES), "a page without a package or back"
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in PACKAGES:
        assert f"packages/{name}.md" in nav, name


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_each_package_readme_is_short_and_links_to_its_docs_page(name):
    readme = PACKAGES[name] / "README.md"
    text = readme.read_text()
    lines = len(text.splitlines())
    assert lines <= README_MAX_LINES, (f"{readme.relative_to(ROOT)} has {lines} lines (at most {README_MAX_LINES}): "
                                       f"move the details to docs/packages/{name}.md")
    page = PACKAGE_PAGES / f"{name}.md"
    targets = {(readme.parent / link.partition("#")[0]).resolve() for link in _links(text) if "://" not in link}
    assert page.resolve() in targets, f"{readme.relative_to(ROOT)} does not link to docs/packages/{name}.md"
    assert "mkdocs serve" in text, f"{readme.relative_to(ROOT)} does not say how to see the site"


@pytest.mark.parametrize("readme", ["README.md", *sorted(f"{p.relative_to(ROOT)}/README.md" for p in PACKAGES.values())])
def test_readme_links_to_repository_files_and_their_headings_exist(readme):
    """A README is read on GitHub: every relative link must reach a file, and an anchor a heading of it."""
    path = ROOT / readme
    for link in _links(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):
            continue
        target, _, anchor = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        assert resolved.exists(), f"{readme}: {link} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved.read_text()), f"{readme}: {link}: no such heading"


def test_links_out_of_docs_are_made_to_work_on_the_site(tmp_path):
    (tmp_path / "docs" / "packages").mkdir(parents=True)
    (tmp_path / "two" / "pics").mkdir(parents=True)
    (tmp_path / "two" / "pics" / "plot.png").write_bytes(b"png")
    (tmp_path / "two" / "src").mkdir()
    (tmp_path / "two" / "src" / "run.py").write_text("")
    page = textwrap.dedent("""\
        # two

        See [one](one.md#usage), [home](../index.md), [this](#section-b), [a site](https://example.org/x.md),
        [the script](../../two/src/run.py#L3), [the folder](../../two/), [gone](../../two/nowhere.py),
        [above](../../../x.md) and ![a plot](../../two/pics/plot.png "Plot").

        ```markdown
        ![left alone](../../two/pics/plot.png)
        ```

        ## Section B
        """)
    links = gen.outside_links(page, "packages/two.md", tmp_path)
    assert links.markdown == textwrap.dedent("""\
        # two

        See [one](one.md#usage), [home](../index.md), [this](#section-b), [a site](https://example.org/x.md),
        the script, the folder, [gone](../../two/nowhere.py),
        [above](../../../x.md) and ![a plot](../assets/two/pics/plot.png "Plot").

        ```markdown
        ![left alone](../../two/pics/plot.png)
        ```

        ## Section B
        """)
    assert links.assets == {"assets/two/pics/plot.png": tmp_path / "two" / "pics" / "plot.png"}
    assert links.kept_as_text == ["packages/two.md: ../../two/src/run.py#L3", "packages/two.md: ../../two/"]
    assert links.missing == ["packages/two.md: ../../two/nowhere.py", "packages/two.md: ../../../x.md"]
    top = gen.outside_links("![a plot](../two/pics/plot.png)", "index.md", tmp_path)
    assert top.markdown == "![a plot](assets/two/pics/plot.png)"

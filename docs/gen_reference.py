"""Pages of the documentation site that are generated from the code, and the checks that it is documented.

Every ``*_page`` function is pure: it takes the objects to document (with the installed ones as
defaults) and returns the page's Markdown. The ``undocumented_*`` functions take the same objects
and return one line per thing that has no documentation (an empty list when all is documented);
tests/core/test_docs_site.py runs them on the real objects and on fixtures that lack documentation.

The pages are committed under ``docs/reference/`` so that their links work outside a built site (on
GitHub, in an editor); ``python docs/gen_reference.py docs`` rewrites them. docs/mkdocs_hooks.py calls
:func:`generated_files` before every build (``mkdocs build`` or ``mkdocs serve``) and builds the site
from what it returns, so the site is always current; tests/core/test_docs_site.py checks with
:func:`reference_outline` that the committed pages name the same hooks, commands, options and config
fields (their formatting may follow the installed typer and rich).

The hand-written pages (``docs/*.md``, the package pages ``docs/packages/<name>.md``) are MkDocs'
own; :func:`outside_links` is what the hook does to their links that leave ``docs/`` for another
file of the repository (an image a package page shows, a source file).
"""

from __future__ import annotations

import html
import inspect
import posixpath
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import unquote

REPO_ROOT = Path(__file__).resolve().parent.parent

ASSET_DIR = "assets"  # repository files the pages show (images) are copied to assets/<their repository path>
REFERENCE_PAGES = {"hooks": "reference/hooks.md", "cli": "reference/cli.md",
                   "configuration": "reference/configuration.md"}
HELP_WIDTH = 100  # terminal width the CLI help is formatted for
CONFIG_KINDS = ("env", "generator", "trainer", "engine")
_ASSET_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"}


# -- docstrings -> Markdown ---------------------------------------------------------------------------


def docstring_markdown(doc: str) -> str:
    """A reST-flavoured docstring as Markdown: ``x`` and :role:`x` become `x`, a ``::`` block a code block."""
    doc = re.sub(r":(?:func|meth|class|data|attr|mod|obj|exc):`~?([^`]+)`", r"`\1`", doc)
    doc = re.sub(r"``([^`]+)``", r"`\1`", doc)
    lines: list[str] = []
    for line in doc.splitlines():
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]  # "Example::" + indented block: the indented block is Markdown code
        lines.append(line)
    return "\n".join(lines).strip()


# -- hooks ----------------------------------------------------------------------------------------------


def hookspecs(module: ModuleType, project: str = "skyrl") -> list[Callable[..., Any]]:
    """The hook specifications a module defines (functions marked by pluggy's ``HookspecMarker(project)``), in source order."""
    functions = [obj for _, obj in inspect.getmembers(module, inspect.isfunction)
                 if obj.__module__ == module.__name__ and getattr(obj, f"{project}_spec", None) is not None]
    return sorted(functions, key=lambda fn: fn.__code__.co_firstlineno)


class _Source(str):
    """An annotation kept as source text (``from __future__ import annotations``), shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def signature_text(fn: Callable[..., Any]) -> str:
    """``(register: Register) -> None``: the signature as written in the source."""
    signature = inspect.signature(fn)

    def shown(annotation: Any) -> Any:
        return _Source(annotation) if isinstance(annotation, str) else annotation

    parameters = [p.replace(annotation=shown(p.annotation)) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=shown(signature.return_annotation)))


def undocumented_hooks(module: ModuleType, project: str = "skyrl") -> list[str]:
    """One line per hookspec of ``module`` without a docstring."""
    return [f"hook {fn.__name__} has no docstring" for fn in hookspecs(module, project)
            if not (inspect.getdoc(fn) or "").strip()]


def protocol_classes(*modules: ModuleType) -> list[type]:
    """The :class:`typing.Protocol` classes the modules define, in source order."""
    found = [cls for module in modules for _, cls in inspect.getmembers(module, inspect.isclass)
             if cls.__module__ == module.__name__ and getattr(cls, "_is_protocol", False)]
    return sorted(found, key=lambda cls: (cls.__module__, inspect.getsourcelines(cls)[1]))


def protocol_members(cls: type) -> list[tuple[str, str, str]]:
    """``(name, declaration, docstring)`` of each member a protocol declares: its attributes, then its methods."""
    members = [(name, f"{name}: {annotation}", "") for name, annotation in cls.__dict__.get("__annotations__", {}).items()]
    for name, fn in cls.__dict__.items():
        if inspect.isfunction(fn) and not name.startswith("_"):
            prefix = "async def" if inspect.iscoroutinefunction(fn) else "def"
            members.append((name, f"{prefix} {name}{signature_text(fn)}", inspect.getdoc(fn) or ""))
    return members


def contracts_section(classes: list[type]) -> list[str]:
    """The protocols between components (engine, generator, trainer) as Markdown lines for the hook reference."""
    out = ["## Contracts between components {#contracts}", "",
           "What core and trainers need of the components plugins register, as `typing.Protocol` classes: a class "
           "satisfies one by having its members, not by subclassing it. An engine's optional capabilities are "
           "protocols of their own, checked with `isinstance` where they are used.", "",
           "| protocol | first line |", "|---|---|"]
    for cls in classes:
        first = (inspect.getdoc(cls) or "").strip().split("\n\n")[0].replace("\n", " ")
        out.append(f"| [`{cls.__module__}.{cls.__name__}`](#{cls.__name__}) | {_cell(docstring_markdown(first))} |")
    out.append("")
    for cls in classes:
        out += [f"### `{cls.__name__}` {{#{cls.__name__}}}", "", f"`{cls.__module__}.{cls.__name__}`", "",
                docstring_markdown(inspect.getdoc(cls) or "*(no docstring)*"), ""]
        for _, declaration, doc in protocol_members(cls):
            out += ["```python", declaration, "```", ""] + ([docstring_markdown(doc), ""] if doc else [])
    return out


def hooks_page(module: ModuleType | None = None, project: str = "skyrl", contracts: list[type] | None = None) -> str:
    """The hook reference: the module's docstring, then each hookspec's name, signature and docstring, then the
    protocols between components (``contracts``; by default those of ``skyrl_core.engine`` and
    ``skyrl_core.protocols``)."""
    if module is None:
        from skyrl_core import hookspecs as module  # noqa: PLC0415 - the installed hookspecs by default
    if contracts is None:
        from skyrl_core import engine, protocols  # noqa: PLC0415 - the installed ones

        contracts = protocol_classes(engine, protocols)
    specs = hookspecs(module, project)
    out = ["# Hooks", "",
           f"Generated from `{module.__name__}` by `docs/gen_reference.py`: every hook a plugin can implement, "
           "with its signature and docstring. A plugin implements a hook by defining a function of the same "
           "name decorated with `skyrl_core.hookimpl`; it may leave out arguments it does not use.", ""]
    if module.__doc__:
        out += [docstring_markdown(inspect.cleandoc(module.__doc__)), ""]
    out += ["| hook | first line |", "|---|---|"]
    for fn in specs:
        first = (inspect.getdoc(fn) or "").strip().split("\n\n")[0].replace("\n", " ")
        out.append(f"| [`{fn.__name__}`](#{fn.__name__}) | {_cell(docstring_markdown(first))} |")
    out.append("")
    for fn in specs:
        out += [f"## `{fn.__name__}` {{#{fn.__name__}}}", "", "```python",
                f"def {fn.__name__}{signature_text(fn)}", "```", "",
                docstring_markdown(inspect.getdoc(fn) or "*(no docstring)*"), ""]
    out += contracts_section(contracts)
    return "\n".join(out)


# -- CLI ------------------------------------------------------------------------------------------------


@dataclass
class CommandDoc:
    path: str  # "skyrl new env"
    command: Any  # a click/typer Command
    context: Any  # its Context, with parents up to the root
    children: list[str] = field(default_factory=list)


def _root_command(app: Any) -> Any:
    """A click-style command from a ``typer.Typer`` (or the command itself)."""
    try:
        import typer
    except ImportError:  # pragma: no cover - typer is a core dependency
        return app
    return typer.main.get_command(app) if isinstance(app, typer.Typer) else app


def walk_commands(app: Any, name: str = "skyrl", width: int = HELP_WIDTH) -> Iterator[CommandDoc]:
    """Every command and sub-command of ``app`` (a typer app or a click command), depth first, hidden ones left out."""
    root = _root_command(app)
    context_class = type(root).context_class if hasattr(type(root), "context_class") else None
    if context_class is None:  # pragma: no cover - every click/typer command has one
        raise TypeError(f"{root!r} is not a click or typer command")

    def visit(command: Any, context: Any, path: str) -> Iterator[CommandDoc]:
        names = command.list_commands(context) if hasattr(command, "list_commands") else []
        subs = [(n, command.get_command(context, n)) for n in names]
        subs = [(n, c) for n, c in subs if c is not None and not getattr(c, "hidden", False)]
        yield CommandDoc(path, command, context, [n for n, _ in subs])
        for sub_name, sub in subs:
            yield from visit(sub, context_class(sub, info_name=sub_name, parent=context), f"{path} {sub_name}")

    yield from visit(root, context_class(root, info_name=name, terminal_width=width, max_content_width=width), name)


def command_help(doc: CommandDoc) -> str:
    """The command's ``--help`` output as the CLI prints it without colour (typer's plain formatter)."""
    command = doc.command
    if hasattr(command, "rich_markup_mode"):
        command.rich_markup_mode = None  # typer's own plain-text help, not the rich panels
    return command.get_help(doc.context).rstrip()


def _help_text(command: Any) -> str:
    return (getattr(command, "help", None) or getattr(command, "short_help", None) or "").strip()


def undocumented_commands(app: Any, name: str = "skyrl") -> list[str]:
    """One line per command without help text and per argument or option of one without help."""
    problems = []
    for doc in walk_commands(app, name):
        if not _help_text(doc.command):
            problems.append(f"command `{doc.path}` has no help text")
        for param in doc.command.params:
            if getattr(param, "hidden", False):
                continue
            if not (getattr(param, "help", None) or "").strip():
                kind = "option" if getattr(param, "param_type_name", "") == "option" else "argument"
                shown = "/".join(getattr(param, "opts", []) or [param.name])
                problems.append(f"command `{doc.path}`: {kind} {shown} has no help text")
    return problems


def _distribution_of(command: Any) -> str | None:
    """The distribution whose code defines the command (its callback, or the first sub-command's)."""
    from importlib.metadata import packages_distributions

    callback = getattr(command, "callback", None)
    module = getattr(callback, "__module__", "") or ""
    if module.startswith(("typer", "click")) or not module:
        for sub in getattr(command, "commands", {}).values():
            found = _distribution_of(sub)
            if found:
                return found
        return None
    top = module.split(".")[0]
    return (packages_distributions().get(top) or [top])[0]


def cli_page(app: Any = None, name: str = "skyrl", width: int = HELP_WIDTH) -> str:
    """The CLI reference: every command and sub-command with its ``--help`` text."""
    if app is None:
        from skyrl_core.cli import build_app

        app = build_app()
    docs = list(walk_commands(app, name, width))
    out = ["# Command line", "",
           f"Generated from `skyrl_core.cli.build_app()` by `docs/gen_reference.py`: every `{name}` command and "
           f"sub-command with its `--help` text (formatted for {width} columns), including the commands that "
           "installed plugins add through the `register_commands` hook. The distribution that defines each "
           "command is named under its heading.", "",
           "| command | what it does |", "|---|---|"]
    for doc in docs[1:]:
        short = doc.command.get_short_help_str(limit=120) if hasattr(doc.command, "get_short_help_str") else ""
        out.append(f"| [`{doc.path}`](#{_anchor(doc.path)}) | {_cell(short)} |")
    out.append("")
    for doc in docs:
        level = "#" * min(1 + max(doc.path.count(" "), 1), 4)  # skyrl, skyrl run: ##; skyrl new env: ###
        out += [f"{level} `{doc.path}` {{#{_anchor(doc.path)}}}", ""]
        dist = _distribution_of(doc.command)
        if dist:
            out += [f"From `{dist}`.", ""]
        out += ["```text", command_help(doc), "```", ""]
    return "\n".join(out)


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


# -- configuration --------------------------------------------------------------------------------------


def config_models(registry: Any = None, kinds: tuple[str, ...] = CONFIG_KINDS) -> dict[str, Any]:
    """``{"env rlm_repl": RLMReplConfig, ..., "run": RunOptions}``: every registered component's config class."""
    if registry is None:
        from skyrl_core.plugins import get_registry

        registry = get_registry()
    from skyrl_core.config import RunOptions

    models: dict[str, Any] = {}
    for kind in kinds:
        for spec in registry.listing(kind):
            model = spec.config_class()
            if model is not None:
                models[f"{kind} {spec.id}"] = model
    models["run"] = RunOptions
    return models


def _nested_models(annotation: Any) -> list[Any]:
    """The pydantic models an annotation names (``Sub``, ``Sub | None``, ``list[Sub]``...)."""
    from pydantic import BaseModel

    found = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    for arg in typing.get_args(annotation):
        found += [m for m in _nested_models(arg) if m not in found]
    return found


def model_fields(model: Any, prefix: str = "", seen: tuple[Any, ...] = ()) -> Iterator[tuple[str, Any, Any]]:
    """``(dotted name, FieldInfo, owning model)`` for every field of ``model``, nested models' fields after theirs."""
    for name, info in model.model_fields.items():
        yield prefix + name, info, model
        for nested in _nested_models(info.annotation):
            if nested not in seen and nested is not model:
                yield from model_fields(nested, f"{prefix}{name}.", (*seen, model))


def _defined_in(model: Any, name: str) -> Any:
    """The class of ``model``'s MRO that declares field ``name`` (where a description has to be added)."""
    for klass in model.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return klass
    return model


def undocumented_fields(models: Mapping[str, Any]) -> list[str]:
    """One line per field (nested ones included) of the given pydantic models without a ``description``."""
    problems = []
    for label, model in models.items():
        for dotted, info, owner in model_fields(model):
            if not (info.description or "").strip():
                leaf = dotted.rsplit(".", 1)[-1]
                klass = _defined_in(owner, leaf)
                problems.append(f"{label}: field {dotted} has no description "
                                f"(declared in {klass.__module__}.{klass.__qualname__})")
    return problems


def type_name(annotation: Any) -> str:
    """A short readable type: ``int | None``, ``Literal['k1', 'k2']``, ``SandboxConfig``."""
    if annotation is None or annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", text)


def default_text(info: Any) -> str:
    """The field's default as the config would show it, or ``required``."""
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except Exception:  # noqa: BLE001 - a factory that needs arguments: name it
            return f"{getattr(info.default_factory, '__name__', 'factory')}()"
    else:
        value = info.default
    if hasattr(value, "model_dump"):
        return "(the nested model's defaults)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _code(text: str) -> str:
    """Inline code that is safe inside a Markdown table cell."""
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def _cell(text: str) -> str:
    """One line of Markdown for a table cell: ``|``, ``<`` and ``&`` escaped outside code spans (tables keep those whole)."""
    text = " ".join(text.split())
    if text.count("`") % 2:  # a short help cut inside a code span
        text += "`"
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else html.escape(part, quote=False).replace("|", "\\|")
                   for part in parts)


def config_page(models: Mapping[str, Any] | None = None) -> str:
    """The configuration reference: for each component's config class, its fields with type, default and description."""
    if models is None:
        models = config_models()
    sections: dict[str, list[str]] = {}
    for label in models:
        sections.setdefault(label.split(" ")[0], []).append(label)
    out = ["# Configuration", "",
           "Generated from the config classes by `docs/gen_reference.py`. A run config has one section per "
           "component (`env`, `generator`, `engine`, `trainer`) holding the chosen component's `id` and its "
           "options, plus the `run` section; every option can also be given on the command line as a dotted "
           "override (`trainer.lr=1e-6`, `env.sandbox.backend=bwrap`). Which fields a section accepts depends "
           "on the component chosen there: each registered component is listed below with its config class. "
           "Nested models are flattened into dotted names.", ""]
    titles = {"env": "Envs (`env.*`)", "generator": "Generators (`generator.*`)",
              "trainer": "Trainers (`trainer.*`)", "engine": "Engines (`engine.*`)", "run": "Run options (`run.*`)"}
    for section, labels in sections.items():
        out += [f"## {titles.get(section, section)}", ""]
        for label in labels:
            model = models[label]
            component = label.partition(" ")[2]
            heading = f"`{component}`" if component else f"`{model.__name__}`"
            out += [f"### {heading} {{#{_anchor(label)}}}", "",
                    f"Config class `{model.__module__}.{model.__qualname__}`.", ""]
            doc = inspect.getdoc(model)
            if doc and doc != inspect.getdoc(model.__mro__[1]):
                out += [docstring_markdown(doc), ""]
            out += ["| field | type | default | description |", "|---|---|---|---|"]
            for dotted, info, _ in model_fields(model):
                description = _cell(info.description or "") or "*(no description)*"
                out.append(f"| {_code(f'{section}.{dotted}')} | {_code(type_name(info.annotation))} | "
                           f"{_code(default_text(info))} | {description} |")
            out.append("")
    return "\n".join(out)


# -- links from the hand-written pages to the rest of the repository ------------------------------------


_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)(\s+\"[^\"]*\")?\)")


def _prose_chunks(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into ``(is_code, chunk)`` pieces at fenced code blocks."""
    chunks: list[tuple[bool, str]] = []
    current: list[str] = []
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        match = _FENCE.match(line)
        if fence is None and match:
            chunks.append((False, "".join(current)))
            current, fence = [line], match.group(1)
        elif fence is not None and match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                and not line.strip()[len(match.group(1)):].strip():
            current.append(line)
            chunks.append((True, "".join(current)))
            current, fence = [], None
        else:
            current.append(line)
    chunks.append((fence is not None, "".join(current)))
    return [(code, chunk) for code, chunk in chunks if chunk]


@dataclass
class OutsideLinks:
    markdown: str  # the page with its links out of docs/ made to work on the site
    assets: dict[str, Path] = field(default_factory=dict)  # site path -> repository file to copy there
    kept_as_text: list[str] = field(default_factory=list)  # "page: target" of links the site has no file for
    missing: list[str] = field(default_factory=list)  # "page: target" of links to files that do not exist


def outside_links(markdown: str, page: str, root: Path = REPO_ROOT, docs_dir: str = "docs") -> OutsideLinks:
    """The links of a hand-written page that leave ``docs_dir`` for another repository file, made to work on the site.

    ``page`` is the page's path inside ``docs_dir`` (``packages/viewer.md``). Pages link to repository
    files relatively (``../../viewer/docs/metrics.png``, ``../../core/src/skyrl_core/env.py``), so the
    links work where the Markdown is read (GitHub, an editor). MkDocs knows only the files in
    ``docs_dir``, so on the site an image becomes a link to its copy under ``assets/<repository path>``
    (listed in ``assets``), and a link to any other file or folder (a source file, a README) keeps its
    text and loses the link (listed in ``kept_as_text``). A link to a path that does not exist is left
    as it is and listed in ``missing`` (the hook reports it as a warning, which fails a strict build).
    Links inside ``docs_dir``, to an anchor of the page or with a scheme (``https:``) are left to MkDocs,
    which checks them; fenced code blocks are left alone.
    """
    result = OutsideLinks("")
    page_dir = posixpath.dirname(posixpath.join(docs_dir, page))

    def rewrite(match: re.Match[str]) -> str:
        bang, label, target, title = match.group(1), match.group(2), match.group(3), match.group(4) or ""
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path = unquote(target.partition("#")[0].partition("?")[0])
        resolved = posixpath.normpath(posixpath.join(page_dir, path))
        if resolved == docs_dir or resolved.startswith(docs_dir + "/"):
            return match.group(0)  # a page or file of the site: MkDocs resolves and checks it
        if resolved.startswith("../") or not (root / resolved).exists():
            result.missing.append(f"{page}: {target}")
            return match.group(0)
        if Path(resolved).suffix.lower() in _ASSET_SUFFIXES and (root / resolved).is_file():
            site_path = f"{ASSET_DIR}/{resolved}"
            result.assets[site_path] = root / resolved
            return f"{bang}[{label}]({posixpath.relpath(site_path, posixpath.dirname(page) or '.')}{title})"
        result.kept_as_text.append(f"{page}: {target}")
        return label

    result.markdown = "".join(chunk if code else _LINK.sub(rewrite, chunk) for code, chunk in _prose_chunks(markdown))
    return result


# -- everything the site needs ---------------------------------------------------------------------------


def generated_files() -> dict[str, str]:
    """Every generated page's Markdown, by site path."""
    return {REFERENCE_PAGES["hooks"]: hooks_page(), REFERENCE_PAGES["cli"]: cli_page(),
            REFERENCE_PAGES["configuration"]: config_page()}


_OUTLINE = re.compile(r"^#+ .*$|^\| <code>[^<]+</code>|(?<![\w-])--[a-z][a-z0-9-]*", re.MULTILINE)


def reference_outline(markdown: str) -> set[str]:
    """What a reference page names: its headings, the config fields of its tables and the command-line
    options of its help texts (what goes stale when the code changes, not how typer lays it out)."""
    return set(_OUTLINE.findall(markdown))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/gen_reference.py OUT_DIR   (docs: rewrite the committed pages)", file=sys.stderr)
        return 2
    out = Path(argv[0])
    for site_path, markdown in generated_files().items():
        target = out / site_path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(markdown, encoding="utf-8")
        print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

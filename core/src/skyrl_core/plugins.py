"""Plugin discovery (entry points in group ``skyrl``) and the registry built from the hooks.

Environment variables:

* ``SKYRL_LOAD_PLUGINS``: comma-separated allow-list of distribution names whose ``skyrl`` entry
  points are loaded; empty string = no third-party plugins. Unset = all installed plugins.
* ``SKYRL_PLUGIN_MODULES``: comma-separated importable modules registered as plugins without being
  packaged (for developing a plugin before writing its ``pyproject.toml``).
* ``SKYRL_TRACE_HOOKS=1``: print every hook call and result to stderr.

Isolation: a plugin that fails to import, to validate (an unknown hook name, a wrong signature) or
whose ``register_*``/``register_commands`` hook raises is unregistered and recorded once in
:attr:`PluginManager.failures`; the other plugins load as usual. Observer (``on_*``)
implementations are guarded: one that raises is logged once per plugin and hook, then ignored.
An ``entry_point_groups`` hook that raises is logged and its plugin listed with no extensions.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import logging
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from skyrl_core import hookspecs
from skyrl_core.registry import KINDS, ComponentSpec, Provider, Registry, RegistryError, did_you_mean

log = logging.getLogger(__name__)

GROUP = "skyrl"
BUILTIN_MODULES = ("skyrl_core.default_plugins",)
# Ids users commonly ask for before installing the package that provides them.
KNOWN_PROVIDERS = {
    "trainer": {"fsdp_grpo": "skyrl-trainers"},
    "engine": {"hf": "skyrl-trainers", "vllm": "skyrl-trainers"},
    "env": {"rlm_repl": "skyrl-rlm-repl", "sql": "skyrl-sql", "harbor_terminal": "skyrl-harbor-terminal",
            "search": "skyrl-search"},
    "generator": {"rlm_tree": "skyrl-rlm-repl"},
}
_HOOK_FOR_KIND = {"env": "register_envs", "generator": "register_generators",
                  "trainer": "register_trainers", "engine": "register_inference_engines"}


@dataclass
class PluginRecord:
    """One loaded (or failed) plugin, as shown by ``skyrl plugins``."""

    name: str
    version: str
    module: str
    hooks: list[str]
    error: str | None = None
    # Messages for ids this plugin registers that another plugin registers too.
    clashes: list[str] = field(default_factory=list)
    # Entry points installed in the plugin's own groups (its ``entry_point_groups`` hook), by group.
    extensions: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "module": self.module,
                "hooks": self.hooks, "error": self.error, "clashes": self.clashes, "extensions": self.extensions}


class _Observers:
    """One plugin's observer implementations, guarded, as attributes: registered next to it (see
    :meth:`PluginManager.register`)."""


def _is_observer(opts: Any, attr: str) -> bool:
    """Whether a hook implementation is a guarded observer: an ``on_*`` hook, not a hook wrapper."""
    return (opts.get("specname") or attr).startswith("on_") and not (opts.get("hookwrapper") or opts.get("wrapper"))


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus the provider of each plugin and the plugins that failed to load."""

    def __init__(self) -> None:
        super().__init__(GROUP)
        self.add_hookspecs(hookspecs)
        self.providers: dict[int, Provider] = {}
        self.failures: list[PluginRecord] = []
        self._registry: Registry | None = None
        self._observers: dict[str, _Observers] = {}  # plugin name -> its guarded observers (see register)
        if os.environ.get("SKYRL_TRACE_HOOKS"):
            self.trace.root.setwriter(sys.stderr.write)
            self.enable_tracing()

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """pluggy's ``register``, with the plugin's observer (``on_*``) implementations guarded.

        Why a companion: an observer that raises is logged once and ignored, but pluggy has no
        per-implementation guard (a hook wrapper wraps all of a hook's implementations, so one raise would
        skip the rest) and rewriting its ``HookImpl.function`` would touch its internals. So
        :meth:`parse_hookimpl_opts` (pluggy's documented override point) leaves the plugin's observers out
        and guarded copies are registered on a companion object, ``NAME:observers``, right after it: pluggy
        never sees the raw functions. :meth:`records` shows the companion's hooks as the plugin's;
        :meth:`unregister` removes both.
        """
        plugin_name = super().register(plugin, name=name)
        if plugin_name is None:
            return None
        observers = _Observers()
        for attr in dir(plugin):
            opts = super().parse_hookimpl_opts(plugin, attr)
            if opts is not None and _is_observer(opts, attr):
                hook_name = opts.get("specname") or attr
                setattr(observers, attr, self._guard(getattr(plugin, attr), plugin, hook_name))
        if vars(observers):
            try:
                super().register(observers, name=f"{plugin_name}:observers")
            except Exception:
                super().unregister(plugin)  # e.g. an observer with a wrong signature: all or nothing
                raise
            self._observers[plugin_name] = observers
        return plugin_name

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        """pluggy's, except that a plugin's observers are skipped: its companion holds them guarded."""
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is not None and not isinstance(plugin, _Observers) and _is_observer(opts, name):
            return None
        return opts

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        """pluggy's ``unregister``, which also unregisters the plugin's guarded observers."""
        name = name or (self.get_name(plugin) if plugin is not None else None)
        removed = super().unregister(plugin, name)
        observers = self._observers.pop(name, None)  # type: ignore[arg-type] - super() asserted a name
        if observers is not None:
            super().unregister(observers)
        return removed

    def _guard(self, function: Callable[..., Any], plugin: object, hook_name: str) -> Callable[..., Any]:
        """``function`` logging (once per plugin and hook) and swallowing what it raises."""
        warned = False

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            nonlocal warned
            try:
                return function(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - an observer never fails an episode or a step
                if not warned:
                    warned = True
                    log.warning("plugin %s: its %s hook raised %s: %s; ignored (reported once)",
                                self.provider_of(plugin).name, hook_name, type(exc).__name__, exc)
                return None

        return guarded

    def register_plugin(self, plugin: object, provider: Provider, name: str | None = None) -> bool:
        """Register ``plugin`` (a module or object with ``@hookimpl`` functions) as from ``provider``.

        A plugin that does not validate (unknown hook name, wrong hook signature) is not registered:
        the problem is recorded in :attr:`failures` and ``False`` returned.
        """
        problem = self._unknown_hooks(plugin)
        if problem is None:
            try:
                self.register(plugin, name=name)
            except pluggy.PluginValidationError as exc:
                problem = str(exc)
        if problem is not None:
            self._record_failure(plugin, provider, problem)
            return False
        self.providers[id(plugin)] = provider
        self._registry = None
        return True

    def _unknown_hooks(self, plugin: object) -> str | None:
        """A message naming the ``@hookimpl`` functions of ``plugin`` that match no hook, or None."""
        known = sorted(name for name, caller in vars(self.hook).items() if caller.has_spec())
        problems = []
        for attr in dir(plugin):
            opts = super().parse_hookimpl_opts(plugin, attr)  # observers included
            hook_name = opts and (opts.get("specname") or attr)
            if hook_name and hook_name not in known:
                problems.append(f"unknown hook {hook_name!r}.{did_you_mean(hook_name, known)}")
        return " ".join(problems) + f" Hooks: {', '.join(known)}." if problems else None

    def unregister_plugin(self, plugin: object) -> None:
        self.unregister(plugin)
        self.providers.pop(id(plugin), None)
        self._registry = None

    def provider_of(self, plugin: object) -> Provider:
        return self.providers.get(id(plugin)) or Provider(getattr(plugin, "__name__", repr(plugin)), "dev")

    @property
    def registry(self) -> Registry:
        """The registry, built from the ``register_*`` hooks on first use."""
        if self._registry is None:
            self._registry = self._build_registry()
        return self._registry

    def _build_registry(self) -> Registry:
        # Collect each plugin's specs first: a plugin whose hook raises contributes none of them.
        collected: dict[int, tuple[Provider, list[ComponentSpec]]] = {}
        for kind in KINDS:
            caller = getattr(self.hook, _HOOK_FOR_KIND[kind])
            # Call each implementation on its own so every spec is attributed to its plugin.
            for impl in reversed(caller.get_hookimpls()):
                if not self.is_registered(impl.plugin):
                    continue  # failed in an earlier kind's hook
                provider = self.provider_of(impl.plugin)
                specs = collected.setdefault(id(impl.plugin), (provider, []))[1]

                def register(spec: Any, _provider: Provider = provider, _kind: str = kind,
                             _specs: list[ComponentSpec] = specs) -> None:
                    if not isinstance(spec, ComponentSpec) or spec.kind != _kind:
                        raise RegistryError(f"{_provider.name}: {_HOOK_FOR_KIND[_kind]} got a "
                                            f"{type(spec).__name__}; expected a {_kind} spec")
                    _specs.append(spec)

                self.trace(f"{_HOOK_FOR_KIND[kind]} from {provider.name} {provider.version}")
                try:
                    impl.function(**({"register": register} if impl.argnames else {}))
                except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the rest
                    self.fail_plugin(impl.plugin, exc)
                    collected.pop(id(impl.plugin))
        registry = Registry(known_providers=KNOWN_PROVIDERS)  # type: ignore[arg-type]
        for provider, specs in collected.values():
            for spec in specs:
                registry.add(spec, provider)
        return registry

    def probes(self) -> list[Any]:
        """Every plugin's adversarial probes (``register_probes``), in registration order; a plugin whose hook
        raises is reported and unregistered, like a failing ``register_*`` hook."""
        from skyrl_core.probe import Probe

        found: list[Any] = []
        for impl in reversed(self.hook.register_probes.get_hookimpls()):
            provider = self.provider_of(impl.plugin)

            def register(probe: Any, _provider: Provider = provider) -> None:
                if not isinstance(probe, Probe):
                    raise RegistryError(f"{_provider.name}: register_probes got a {type(probe).__name__}; "
                                        "expected a skyrl_core.probe.Probe")
                found.append(probe)

            try:
                impl.function(**({"register": register} if impl.argnames else {}))
            except Exception as exc:  # noqa: BLE001 - the other plugins' probes still run
                self.fail_plugin(impl.plugin, exc)
        return found

    def register_commands(self, cli: Any) -> None:
        """Call every plugin's ``register_commands``; a plugin whose hook raises is reported and unregistered."""
        for impl in reversed(self.hook.register_commands.get_hookimpls()):
            try:
                impl.function(**({"cli": cli} if impl.argnames else {}))
            except Exception as exc:  # noqa: BLE001 - the built-in commands must keep working
                self.fail_plugin(impl.plugin, exc)

    def fail_plugin(self, plugin: object, exc: BaseException) -> None:
        """Record ``plugin``'s failure once and unregister it, so the other plugins run unaffected."""
        self._record_failure(plugin, self.provider_of(plugin), exc)
        self.unregister_plugin(plugin)

    def _record_failure(self, plugin: object, provider: Provider, error: BaseException | str) -> None:
        message = error if isinstance(error, str) else "".join(traceback.format_exception(error))
        self.failures.append(PluginRecord(provider.name, provider.version,
                                          getattr(plugin, "__name__", repr(plugin)), [], message))

    def records(self, include_builtins: bool = False) -> list[PluginRecord]:
        """Loaded plugins (with the hooks each implements and their extensions) followed by failed ones."""
        registry = self.registry
        extensions = self._extensions()
        out = []
        for plugin in self.get_plugins():
            provider = self.provider_of(plugin)
            if isinstance(plugin, _Observers) or (provider.name == "skyrl-core" and not include_builtins):
                continue
            observers = self._observers.get(self.get_name(plugin) or "")
            hooks = sorted(h.name for p in (plugin, observers) if p is not None for h in self.get_hookcallers(p) or [])
            clashes = [registry.clash_message(kind, spec_id) for kind in KINDS
                       for spec_id, specs in registry.clashes[kind].items()
                       if any(spec.provider == provider for spec in specs)]
            out.append(PluginRecord(provider.name, provider.version,
                                    getattr(plugin, "__name__", type(plugin).__name__), hooks, clashes=clashes,
                                    extensions=extensions.get(id(plugin), {})))
        return sorted(out, key=lambda r: r.name) + self.failures

    def _extensions(self) -> dict[int, dict[str, list[dict[str, str]]]]:
        """Per plugin (by id), the entry points installed in each group its ``entry_point_groups`` names."""
        found = {}
        for impl in self.hook.entry_point_groups.get_hookimpls():
            try:
                groups = list(impl.function())
            except Exception as exc:  # noqa: BLE001 - a listing never fails over one plugin
                log.warning("plugin %s: its entry_point_groups hook raised %s: %s; no extensions listed",
                            self.provider_of(impl.plugin).name, type(exc).__name__, exc)
                continue
            found[id(impl.plugin)] = {group: sorted((_entry_point_row(ep) for ep in md.entry_points(group=group)),
                                                    key=lambda row: (row["name"], row["provider"]))
                                      for group in groups}
        return found


def _entry_point_row(ep: md.EntryPoint) -> dict[str, str]:
    dist = ep.dist
    return {"name": ep.name, "value": ep.value, "provider": dist.name if dist else ep.module,
            "version": dist.version if dist else "unknown"}


def _allow_list() -> set[str] | None:
    value = os.environ.get("SKYRL_LOAD_PLUGINS")
    if value is None:
        return None
    return {_normalise(name) for name in value.split(",") if name.strip()}


def _normalise(dist_name: str) -> str:
    return dist_name.strip().lower().replace("_", "-")


def load_entry_point_plugins(pm: PluginManager) -> None:
    allowed = _allow_list()
    entry_points = md.entry_points(group=GROUP)
    if allowed:
        installed = sorted({_normalise(ep.dist.name) for ep in entry_points if ep.dist})
        for name in sorted(allowed - set(installed)):
            log.warning("SKYRL_LOAD_PLUGINS names %r, which is no installed skyrl plugin distribution.%s "
                        "Installed: %s", name, did_you_mean(name, installed), ", ".join(installed) or "none")
    for ep in entry_points:
        dist = ep.dist
        provider = Provider(dist.name if dist else ep.module, dist.version if dist else "unknown")
        if allowed is not None and _normalise(provider.name) not in allowed:
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # noqa: BLE001 - reported by `skyrl plugins`, never fatal for listing
            pm._record_failure(ModuleType(ep.value), provider, exc)
            continue
        pm.register_plugin(plugin, provider, name=f"{provider.name}:{ep.name}")


def load_module_plugins(pm: PluginManager, modules: list[str]) -> None:
    for module_name in modules:
        provider = Provider(module_name, "dev")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - reported by `skyrl plugins`
            pm._record_failure(ModuleType(module_name), provider, exc)
            continue
        pm.register_plugin(module, provider)


def new_plugin_manager(entry_points: bool = True) -> PluginManager:
    """A fresh manager with the built-ins, and installed plugins unless ``entry_points`` is False."""
    pm = PluginManager()
    core = Provider("skyrl-core", _core_version())
    for module_name in BUILTIN_MODULES:
        pm.register_plugin(importlib.import_module(module_name), core)
    if entry_points:
        load_entry_point_plugins(pm)
    dev_modules = [m.strip() for m in os.environ.get("SKYRL_PLUGIN_MODULES", "").split(",") if m.strip()]
    load_module_plugins(pm, dev_modules)
    return pm


_pm: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created (and plugins discovered) on first call."""
    global _pm
    if _pm is None:
        _pm = new_plugin_manager()
    return _pm


def set_plugin_manager(pm: PluginManager | None) -> PluginManager | None:
    """Swap the process-wide manager (used by the test fixtures); returns the previous one."""
    global _pm
    previous, _pm = _pm, pm
    return previous


def get_registry() -> Registry:
    return get_plugin_manager().registry


def _core_version() -> str:
    try:
        return md.version("skyrl-core")
    except md.PackageNotFoundError:
        return "0+unknown"

"""Plugin discovery (entry points in group ``skyrl``) and the registry built from the hooks.

Environment variables:

* ``SKYRL_LOAD_PLUGINS``: comma-separated allow-list of distribution names whose ``skyrl`` entry
  points are loaded; empty string = no third-party plugins. Unset = all installed plugins.
* ``SKYRL_PLUGIN_MODULES``: comma-separated importable modules registered as plugins without being
  packaged (for developing a plugin before writing its ``pyproject.toml``).
* ``SKYRL_TRACE_HOOKS=1``: print every hook call and result to stderr.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pluggy

from skyrl_core import hookspecs
from skyrl_core.registry import KINDS, Provider, Registry, RegistryError

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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "module": self.module,
                "hooks": self.hooks, "error": self.error}


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus the provider of each plugin and the plugins that failed to load."""

    def __init__(self) -> None:
        super().__init__(GROUP)
        self.add_hookspecs(hookspecs)
        self.providers: dict[int, Provider] = {}
        self.failures: list[PluginRecord] = []
        self._registry: Registry | None = None
        if os.environ.get("SKYRL_TRACE_HOOKS"):
            self.trace.root.setwriter(sys.stderr.write)
            self.enable_tracing()

    def register_plugin(self, plugin: object, provider: Provider, name: str | None = None) -> None:
        """Register ``plugin`` (a module or object with ``@hookimpl`` functions) as from ``provider``."""
        self.register(plugin, name=name)
        self.check_pending()
        self.providers[id(plugin)] = provider
        self._registry = None

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
        registry = Registry(known_providers=KNOWN_PROVIDERS)  # type: ignore[arg-type]
        for kind in KINDS:
            caller = getattr(self.hook, _HOOK_FOR_KIND[kind])
            # Call each implementation on its own so every spec is attributed to its plugin.
            for impl in reversed(caller.get_hookimpls()):
                provider = self.provider_of(impl.plugin)

                def register(spec: Any, _provider: Provider = provider, _kind: str = kind) -> None:
                    if getattr(spec, "kind", None) != _kind:
                        raise RegistryError(f"{_provider.name}: {_HOOK_FOR_KIND[_kind]} got a "
                                            f"{type(spec).__name__}; expected a {_kind} spec")
                    registry.add(spec, _provider)

                self.trace(f"{_HOOK_FOR_KIND[kind]} from {provider.name} {provider.version}")
                try:
                    impl.function(**({"register": register} if impl.argnames else {}))
                except RegistryError as exc:
                    if "registered twice" in str(exc):
                        raise
                    self._record_failure(impl.plugin, provider, exc)
                except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the rest
                    self._record_failure(impl.plugin, provider, exc)
        return registry

    def _record_failure(self, plugin: object, provider: Provider, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(exc))
        self.failures.append(PluginRecord(provider.name, provider.version,
                                          getattr(plugin, "__name__", repr(plugin)), [], tb))

    def records(self, include_builtins: bool = False) -> list[PluginRecord]:
        """Loaded plugins (with the hooks each implements) followed by failed ones."""
        out = []
        for plugin in self.get_plugins():
            provider = self.provider_of(plugin)
            if provider.name == "skyrl-core" and not include_builtins:
                continue
            hooks = sorted(h.name for h in self.get_hookcallers(plugin) or [])
            out.append(PluginRecord(provider.name, provider.version,
                                    getattr(plugin, "__name__", type(plugin).__name__), hooks))
        return sorted(out, key=lambda r: r.name) + self.failures


def _allow_list() -> set[str] | None:
    value = os.environ.get("SKYRL_LOAD_PLUGINS")
    if value is None:
        return None
    return {_normalise(name) for name in value.split(",") if name.strip()}


def _normalise(dist_name: str) -> str:
    return dist_name.strip().lower().replace("_", "-")


def load_entry_point_plugins(pm: PluginManager) -> None:
    allowed = _allow_list()
    for ep in md.entry_points(group=GROUP):
        dist = ep.dist
        provider = Provider(dist.name if dist else ep.module, dist.version if dist else "unknown")
        if allowed is not None and _normalise(provider.name) not in allowed:
            continue
        try:
            plugin = ep.load()
            pm.register_plugin(plugin, provider, name=f"{provider.name}:{ep.name}")
        except Exception as exc:  # noqa: BLE001 - reported by `skyrl plugins`, never fatal for listing
            pm._record_failure(ModuleType(ep.value), provider, exc)


def load_module_plugins(pm: PluginManager, modules: list[str]) -> None:
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
            pm.register_plugin(module, Provider(module_name, "dev"))
        except Exception as exc:  # noqa: BLE001
            pm._record_failure(ModuleType(module_name), Provider(module_name, "dev"), exc)


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

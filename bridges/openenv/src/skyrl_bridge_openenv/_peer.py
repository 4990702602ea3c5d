"""Import ``openenv.core`` without its optional Gradio web UI (about 7 of its 9 seconds of import time).

``openenv.core.env_server`` imports its web interface eagerly, inside a ``try`` that treats a missing module as
"no web UI"; the bridge never serves that UI (it sets ``ENABLE_WEB_INTERFACE=false`` for its servers), so the first
import here hides the module for that one import and then un-hides it: code that imports
``openenv.core.env_server.web_interface`` itself later still gets the real module.
"""

from __future__ import annotations

import sys
import threading

_WEB_UI = "openenv.core.env_server.web_interface"
_lock = threading.Lock()


def load_openenv_core() -> None:
    if "openenv.core.env_server" in sys.modules:
        return
    with _lock:
        if "openenv.core.env_server" in sys.modules:
            return
        hidden = _WEB_UI not in sys.modules
        if hidden:
            sys.modules[_WEB_UI] = None  # type: ignore[assignment]  # import of it raises ModuleNotFoundError
        try:
            import openenv.core.env_server  # noqa: F401
        finally:
            if hidden and sys.modules.get(_WEB_UI, 0) is None:
                del sys.modules[_WEB_UI]

"""The page's files: our own HTML/JS/CSS (package data) and the charting library.

Charts use plotly.js, taken from the ``plotly`` Python package, which ships the minified bundle as
package data (``plotly/package_data/plotly.min.js``). Why plotly rather than a smaller library such
as uPlot fetched from npm at build time: it is a maintained, widely used library that arrives through
pip like everything else here (no npm step in the build, no vendored copy to refresh), it works
offline, and it brings what the metrics view needs out of the box: hover values, legends that toggle
runs, zoom and pan, and error bands. The price is size (about 4.8 MB): it is served once and cached by
the browser, and an exported file carries it inline.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

STATIC_TYPES = {"index.html": "text/html", "app.js": "text/javascript", "app.css": "text/css"}
PLOTLY_NAME = "plotly.min.js"


class AssetError(RuntimeError):
    """A file the page needs is not installed."""


def static_text(name: str) -> str:
    """One of our own page files (``index.html``, ``app.js``, ``app.css``)."""
    return resources.files("skyrl_viewer").joinpath("static", name).read_text(encoding="utf-8")


def plotly_path() -> Path:
    """The ``plotly.min.js`` inside the installed ``plotly`` package."""
    try:
        package = resources.files("plotly")
    except ModuleNotFoundError:
        raise AssetError("the charts need the 'plotly' package: pip install plotly") from None
    path = Path(str(package.joinpath("package_data", PLOTLY_NAME)))
    if not path.is_file():
        raise AssetError(f"the installed plotly package has no {PLOTLY_NAME} (looked for {path})")
    return path

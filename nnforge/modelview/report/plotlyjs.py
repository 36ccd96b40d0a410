"""Which plotly.js bundle the report and the web view load, and its version.

Why not simply plotly.py's bundle: it is the full plotly.js (4.8 MB, every trace type including 3-D, maps and WebGL),
and what a first visit of a page waits for is V8 evaluating it (~1.3 s on a 2-vCPU machine, ~2 s with the other core
busy). Every figure here is a bar, box, heatmap or scatter trace, all in plotly.js's *cartesian* partial bundle
(1.5 MB), which evaluates in a third of the time. ``package.json`` pins that bundle to the same plotly.js version as the
pinned plotly.py's, so the figures' JSON (built by plotly.py) means the same thing to either; ``make`` installs it with
``npm ci`` into ``node_modules/``.

Looked up in this order:
1. ``$NNFORGE_PLOTLY_JS``: any plotly.js bundle file (e.g. a site's own build);
2. the cartesian bundle in ``node_modules/`` beside the package (an editable install, as ``make`` does);
3. plotly.py's full bundle (always present; pages work, first visits are slower).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

CARTESIAN_BUNDLE = Path("node_modules") / "plotly.js-cartesian-dist-min" / "plotly-cartesian.min.js"
CARTESIAN_TRACE_TYPES = frozenset({
    "bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "image", "pie", "scatter",
    "scatterternary", "violin",
})  # fmt: skip
"""What the cartesian bundle can draw (plotly.js's ``lib/index-cartesian.js``); a figure using anything else would
draw an empty chart, which tests/report/test_figures.py guards against."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def full_bundle_path() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def plotly_js_path() -> Path:
    """The bundle to serve or inline (see the module docstring for the order)."""
    override = os.environ.get("NNFORGE_PLOTLY_JS")
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"NNFORGE_PLOTLY_JS={override!r} is not a file")
        return path
    cartesian = repo_root() / CARTESIAN_BUNDLE
    return cartesian if cartesian.is_file() else full_bundle_path()


@lru_cache(maxsize=8)
def bundle_version(path: Path) -> str:
    """plotly.js's version, read from the bundle's banner ("plotly.js (cartesian - minified) v4.1.1"); "unknown" if
    the banner has none."""
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(300)
    for word in head.split():
        if word.startswith("v") and word[1:2].isdigit():
            return word[1:]
    return "unknown"


def plotly_js_text() -> str:
    """The bundle's source, for inlining into a self-contained report."""
    return plotly_js_path().read_text(encoding="utf-8")

"""Start-up warm-up: build what a first visit needs on a background thread while the server starts listening.

Why: the first request for a run page would otherwise pay, in the request, for reading the run's cells and building its
figures (about half a second for 10,000 cells), scanning the run for the filter drop-downs and Jinja compiling the
templates, at the very moment the browser is busy compiling plotly.js. Warmed, that work is done (or under way: the
cache makes a request wait for a build in progress rather than start a second one) before anyone asks. Only the
latest runs, unfiltered: the likeliest first pages; anything else is built on demand and cached as before.
"""

from __future__ import annotations

import logging
import threading

from jinja2 import Environment

from . import queries
from .state import ViewState
from .static import plotly_body

WARM_RUNS = 2
TEMPLATES = ("run.html.j2", "index.html.j2", "cell.html.j2", "compare.html.j2", "error.html.j2")
log = logging.getLogger(__name__)


def warm_up(state: ViewState, env: Environment, n_runs: int = WARM_RUNS) -> None:
    """Cache the runs, the latest ``n_runs`` runs' filter options and unfiltered figures, read plotly.js and compile
    the page templates, cheapest first (what the page itself needs before what its script fetches). Never raises: a
    failure here only means the first request does the work itself."""
    state.warm = "running"
    try:
        runs = sorted(state.runs(), key=lambda r: r.created or 0.0, reverse=True)[:n_runs]
        for run in runs:
            state.options(run.run_id)
        for name in TEMPLATES:
            env.get_template(name)
        plotly_body()
        for run in runs:
            queries.cached_figures(state, run, {})
    except Exception:  # a warm-up must never take the server down
        log.exception("modelview: warming the figure cache failed; pages will build on demand")
    finally:
        state.warm = "done"


def start_warm_up(state: ViewState, env: Environment, n_runs: int = WARM_RUNS) -> threading.Thread:
    state.warm = "running"
    thread = threading.Thread(target=warm_up, args=(state, env, n_runs), daemon=True, name="modelview-warm")
    thread.start()
    return thread

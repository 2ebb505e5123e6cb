"""The explorer: a static HTML report and pool explorer (coverage.py style: templates + vendored JS).

``write_site`` (any trajectories and a filter output), ``write_run_site`` (a reproduce run folder),
``write_filter_site`` (``latentsift explore``), ``save_stage1`` (reproduce keeps the per-candidate
Stage-1 results the explorer shows). See docs/explorer.md.
"""
from .data import Limits, cut
from .site import save_stage1, write_filter_site, write_run_site, write_site

__all__ = ["Limits", "cut", "save_stage1", "write_filter_site", "write_run_site", "write_site"]

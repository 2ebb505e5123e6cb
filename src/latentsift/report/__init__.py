"""Reports from results (data in, files out, into the folder given): report.md (``report``: the
cascade's tables; ``sections``: the protocol's sections; ``_format``: numbers and tables), its figures
(``figures``, ``colors``), the decision and verdict sections (``decision_report``) and the static HTML
explorer (``explore``)."""
from .explore import write_filter_site, write_run_site, write_site
from .figures import FIGURES, write_figures
from .report import render_markdown, write_report

__all__ = ["FIGURES", "render_markdown", "write_figures", "write_filter_site", "write_report", "write_run_site",
           "write_site"]

"""Write a :class:`~._types.Report` to a self-contained folder: one PNG per figure, ``explanation.json`` with the
numbers behind them, and ``index.html`` showing them side by side."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ._figures import attention_heatmap, comparison_bars, kernel_bars, shaded_text
from ._html import render_index
from ._types import Report

JSON_NAME = "explanation.json"
HTML_NAME = "index.html"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:40] or "doc"


def write_report(report: Report, output: str | os.PathLike, max_tokens: int = 64) -> Path:
    """Render every figure of ``report`` into ``output`` (created if needed) and write the JSON and the HTML page.

    Args:
        report: what :func:`~._explainers.explain_documents` returned.
        output: the folder; the figures of an earlier report written there are replaced or removed (only files
            that report's JSON lists), other files are left alone.
        max_tokens: tokens shown per heatmap axis (the JSON keeps them all).

    Returns:
        The path of ``index.html``.
    """
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    earlier = _figures_of_earlier_report(output)
    figures: dict = {}
    shared = figures.setdefault("shared", {})
    for item in report.shared:
        name = f"{item.key}.png"
        attention_heatmap(item, output / name, max_tokens)
        shared[item.key] = name
    for number, document in enumerate(report.documents):
        files = figures.setdefault(number, {})
        prefix = f"d{number + 1}-{_slug(document.docid)}"
        for item in document.attention:
            name = f"{prefix}-{item.key}.png"
            attention_heatmap(item, output / name, max_tokens)
            files[item.key] = name
        if document.kernels is not None:
            title = f"{document.docid}: score {document.kernels.score:.4f}"
            files["kernels"] = f"{prefix}-kernels.png"
            kernel_bars(document.kernels, output / files["kernels"], title)
            files["text"] = f"{prefix}-text.png"
            shaded_text(document.kernels, document.text, output / files["text"],
                        title=f"{document.docid}: terms shaded by best match with “{report.query}”")
    if report.comparison is not None:
        first, second = report.documents[0], report.documents[1]
        figures["comparison"] = {"kernels": "compare-kernels.png"}
        comparison_bars(first.kernels, second.kernels, report.comparison, output / "compare-kernels.png",
                        (first.docid, second.docid))
    (output / JSON_NAME).write_text(json.dumps(report.to_json(figures), indent=1, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    index = output / HTML_NAME
    index.write_text(render_index(report, figures, JSON_NAME), encoding="utf-8")
    written = {name for files in figures.values() for name in files.values()}
    for name in earlier - written:  # figures of an earlier report here that this one does not show
        (output / name).unlink(missing_ok=True)
    return index


def _figures_of_earlier_report(output: Path) -> set[str]:
    """The PNG names an earlier report in ``output`` listed in its JSON (only those are ever removed)."""
    try:
        earlier = json.loads((output / JSON_NAME).read_text(encoding="utf-8"))
        groups = [earlier.get("shared_figures", {}), earlier.get("comparison_figures", {})]
        groups += [document.get("figures", {}) for document in earlier.get("documents", [])]
        names = {name for group in groups for name in group.values()}
    except (OSError, ValueError, AttributeError, TypeError):
        return set()
    return {name for name in names if isinstance(name, str) and Path(name).name == name and name.endswith(".png")}

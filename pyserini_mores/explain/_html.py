"""``index.html``: the figures side by side with the scores, and TK's shaded document text as HTML spans. Plain
HTML with inline CSS and relative links only, so the output folder can be moved or zipped as it is."""
from __future__ import annotations

from html import escape

from ._figures import match_color, text_segments
from ._types import KernelScores, Report

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.35em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-top: 1px solid #ccc; padding-top: .8em; }
table.meta td, table.meta th, table.docs td, table.docs th { padding: .15em .7em; text-align: left; }
table.docs { border-collapse: collapse; } table.docs tr:nth-child(even) { background: #f4f4f4; }
.row { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
figure { margin: 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: .85em; color: #555; max-width: 40em; }
.shaded { font-family: ui-monospace, monospace; font-size: .9em; line-height: 1.8; max-width: 60em;
          border: 1px solid #ddd; padding: .6em; }
.shaded span.term { padding: 0 .08em; border-radius: 2px; } .shaded .unread { color: #999; }
.note { color: #555; font-size: .9em; }
"""


def _figure(filename: str, caption: str) -> str:
    return (f'<figure><a href="{escape(filename)}"><img src="{escape(filename)}" alt="{escape(caption)}"></a>'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def shaded_html(kernels: KernelScores, text: str) -> str:
    """The document text as HTML, each matching term shaded by its best match cosine; hovering a term shows the
    cosine, the query term it matches best and the kernel it falls closest to."""
    best = kernels.best_match.tolist()
    best_term = kernels.best_query_term.tolist()
    nearest = kernels.nearest_kernel.tolist()
    parts = []
    for piece, term, read in text_segments(kernels, text):
        if term is None:
            parts.append(escape(piece) if read else f'<span class="unread">{escape(piece)}</span>')
            continue
        red, green, blue = (round(255 * value) for value in match_color(best[term]))
        query_term = kernels.query_tokens[best_term[term]] if kernels.query_tokens else "-"
        tip = (f"{kernels.doc_tokens[term]}: best match {best[term]:.3f} with '{query_term}', "
               f"closest kernel μ={kernels.kernel_mus[nearest[term]]:g}")
        parts.append(f'<span class="term" style="background: rgb({red},{green},{blue})" title="{escape(tip)}">'
                     f"{escape(piece)}</span>")
    return f'<div class="shaded">{"".join(parts)}</div>'


def render_index(report: Report, figures: dict, json_name: str) -> str:
    """The page: a header with the query and model, a table of the documents, then per document its figures."""
    out = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           f"<title>Why these documents? {escape(report.query)}</title><style>{_STYLE}</style></head><body>"]
    out.append(f"<h1>{escape(report.reranker.upper())}: why these documents for “{escape(report.query)}”</h1>")
    heads = "all heads averaged" if report.heads is None else "heads " + ", ".join(map(str, report.heads)) + " averaged"
    meta = [("Reranker", report.reranker), ("Model", report.model or "-"), ("Index", report.index or "-"),
            ("Document representations", report.source)]
    if report.shared or any(document.attention for document in report.documents):  # kernel explanations have none
        meta.append(("Attention", heads))
    out.append('<table class="meta">' + "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>"
                                                for k, v in meta) + "</table>")
    out.append(f'<p>The numbers behind every figure: <a href="{escape(json_name)}">{escape(json_name)}</a>.</p>')
    for note in report.notes:
        out.append(f'<p class="note">{escape(note)}</p>')

    out.append('<table class="docs"><tr><th>#</th><th>docid</th><th>score</th><th>rank</th><th>BM25 rank</th>'
               "<th>BM25 score</th><th>text</th></tr>")
    for number, document in enumerate(report.documents, start=1):
        cells = [number, f'<a href="#doc{number}">{escape(document.docid)}</a>', f"{document.score:.4f}",
                 _or_dash(document.rank), _or_dash(document.bm25_rank),
                 "-" if document.bm25_score is None else f"{document.bm25_score:.3f}",
                 escape(document.text[:90] + ("…" if len(document.text) > 90 else ""))]
        out.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    out.append("</table>")

    shared = figures.get("shared", {})
    if shared:
        out.append("<h2>Shared by every document</h2><div class=\"row\">")
        for item in report.shared:
            out.append(_figure(shared[item.key], item.title))
        out.append("</div>")
    comparison = figures.get("comparison", {})
    if comparison and report.comparison:
        first, second = report.comparison["first"], report.comparison["second"]
        out.append(f"<h2>What separates {escape(first)} from {escape(second)}</h2>")
        out.append(f"<p>Score difference {report.comparison['score_difference']:+.4g}; the kernels that account for "
                   f"most of it (μ): {', '.join(f'{mu:g}' for mu in report.comparison['kernels_by_influence'][:3])}."
                   "</p>")
        out.append('<div class="row">' + _figure(comparison["kernels"], "Per-kernel shares of each score and their "
                                                 "differences (they add up to the score difference)") + "</div>")

    for number, document in enumerate(report.documents, start=1):
        files = figures.get(number - 1, {})
        out.append(f'<h2 id="doc{number}">{number}. {escape(document.docid)} — score {document.score:.4f}'
                   f"{'' if document.rank is None else f', rank {document.rank}'}"
                   f"{'' if document.bm25_rank is None else f' (BM25 rank {document.bm25_rank})'}</h2>")
        out.append('<div class="row">')
        for item in document.attention:
            out.append(_figure(files[item.key], item.title))
        if document.kernels is not None:
            out.append(_figure(files["kernels"], "Kernel mass per query term, per-kernel scores (model weights "
                                                 "included) and each query term's share of the score"))
        out.append("</div>")
        if document.kernels is not None:
            out.append("<p>Document terms shaded by their best match cosine with any query term "
                       "(hover for the query term and the closest kernel):</p>")
            out.append(shaded_html(document.kernels, document.text))
            out.append('<div class="row">' + _figure(files["text"], "The same shading as a figure") + "</div>")
    out.append("</body></html>\n")
    return "\n".join(out)


def _or_dash(value) -> str:
    return "-" if value is None else str(value)

"""PNG figures of explanations (matplotlib's object API and Agg canvas: no pyplot state, no display needed)."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

from ._types import AttentionMap, KernelScores

DPI = 110
TOKEN_INCH = 0.15  # heatmap cell size
MATCH_CMAP = "YlOrRd"
TEXT_FONT_SIZE = 9
TEXT_WIDTH_CHARS = 90
TEXT_MAX_LINES = 45
MAX_STRIPS = 4  # cross-attention heatmaps wrap the document axis into at most this many strips


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    figure.savefig(path, format="png")
    return path


def match_color(cosine: float) -> tuple[float, float, float]:
    """The RGB shade of a best-match cosine (negative cosines as 0), shared by the PNG and the HTML rendering."""
    from matplotlib import colormaps

    red, green, blue, _ = colormaps[MATCH_CMAP](max(0.0, min(1.0, float(cosine))) * 0.85)
    return red, green, blue


# ---- attention ------------------------------------------------------------------------------------------------------
def attention_heatmap(item: AttentionMap, path: str | os.PathLike, max_tokens: int = 64) -> Path:
    """A heatmap of ``item.weights`` with tokens on both axes (the JSON keeps every token).

    Self-attention maps (rows and columns the same sequence) show the first ``max_tokens`` tokens, as the MORES
    paper shows the first 16; a joined sequence gets lines where the document starts. Cross-attention maps keep
    all their (few) rows and wrap the document axis into strips of ``max_tokens`` columns, up to
    :data:`MAX_STRIPS` strips, all on one colour scale.
    """
    import numpy as np

    rows, columns = item.rows, item.columns
    square = rows == columns
    shown_rows = min(len(rows), max_tokens)
    shown_columns = min(len(columns), max_tokens * (1 if square else MAX_STRIPS))
    weights = item.weights[:shown_rows, :shown_columns].float().numpy()
    strip_width = min(shown_columns, max_tokens)
    strips = [(start, min(start + strip_width, shown_columns)) for start in range(0, shown_columns, strip_width)] \
        or [(0, 0)]
    label_inch = 0.075 * max(map(len, columns[:shown_columns]), default=1) + 0.2
    strip_inch = TOKEN_INCH * shown_rows + label_inch
    width = max(4.0, 1.9 + TOKEN_INCH * strip_width + 0.9)
    figure = _figure(width, max(3.0, 0.9 + strip_inch * len(strips)))
    all_axes = figure.subplots(len(strips), 1, squeeze=False)[:, 0]
    vmax = max(float(weights.max(initial=0.0)), 1e-6)
    for axes, (start, stop) in zip(all_axes, strips):
        strip = np.full((shown_rows, strip_width), np.nan, dtype=np.float32)  # a short last strip keeps cell size
        strip[:, :stop - start] = weights[:, start:stop]
        image = axes.imshow(strip, cmap="Blues", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        axes.set_xticks(range(stop - start), columns[start:stop], rotation=90, fontsize=7)
        axes.set_yticks(range(shown_rows), rows[:shown_rows], fontsize=7)
        axes.tick_params(length=0)
        if item.split is not None:
            if start <= item.split - 0.5 < stop:
                axes.axvline(item.split - 0.5 - start, color="crimson", linewidth=1)
            if item.split - 0.5 < shown_rows:
                axes.axhline(item.split - 0.5, color="crimson", linewidth=1)
    cropped = []
    if shown_rows < len(rows):
        cropped.append(f"first {shown_rows} of {len(rows)} rows")
    if shown_columns < len(columns):
        cropped.append(f"first {shown_columns} of {len(columns)} columns")
    heads = "heads averaged" if item.heads is None else f"heads {','.join(map(str, item.heads))} averaged"
    subtitle = heads + (f"; {', '.join(cropped)}" if cropped else "")
    all_axes[0].set_title("\n".join(textwrap.wrap(item.title, max(30, int(width * 9)))) + f"\n({subtitle})",
                          fontsize=9)
    all_axes[-1].set_xlabel("attended to (keys)", fontsize=8)
    for axes in all_axes:
        axes.set_ylabel("attending", fontsize=8)
    figure.colorbar(image, ax=list(all_axes), shrink=0.8 if len(strips) == 1 else 0.95, label="attention")
    return _save(figure, path)


# ---- TK -------------------------------------------------------------------------------------------------------------
def kernel_bars(kernels: KernelScores, path: str | os.PathLike, title: str = "") -> Path:
    """Three bar charts: kernel mass per query term, per-kernel log/length scores (model weights included), and
    each query term's share of the score."""
    import numpy as np

    mus = kernels.kernel_mus
    positions = np.arange(len(mus))
    labels = [f"{mu:g}" for mu in mus]
    figure = _figure(13.5, 4.2)
    mass_axes, kernel_axes, term_axes = figure.subplots(1, 3, width_ratios=[1.25, 1.25, 0.8])

    terms = kernels.query_tokens
    mass = kernels.query_kernel_mass.numpy()
    width = 0.8 / max(len(terms), 1)
    for index, term in enumerate(terms):
        mass_axes.bar(positions - 0.4 + width * (index + 0.5), mass[index], width, label=term)
    mass_axes.set_xticks(positions, labels)
    mass_axes.set_xlabel("kernel μ")
    mass_axes.set_ylabel("kernel mass Σ_j K_k(cos(q_i, d_j))")
    mass_axes.set_title("Per query term: kernel mass (eq. 6)", fontsize=10)
    if terms:
        mass_axes.legend(fontsize=7, ncols=2 if len(terms) > 6 else 1, title="query term", title_fontsize=7)

    kernel_axes.bar(positions - 0.2, kernels.log_contributions.numpy(), 0.4, label="log: s^k_log (weights incl.)",
                    color="tab:blue")
    kernel_axes.bar(positions + 0.2, kernels.len_contributions.numpy(), 0.4, label="length: s^k_len (weights incl.)",
                    color="tab:orange")
    kernel_axes.axhline(0, color="black", linewidth=0.6)
    kernel_axes.set_xticks(positions, labels)
    kernel_axes.set_xlabel("kernel μ")
    kernel_axes.set_title(f"Per kernel: s_log={kernels.s_log:.3f}, s_len={kernels.s_len:.3f}\n"
                          f"score = {kernels.beta:.3f}·s_log + {kernels.gamma:.3f}·s_len = {kernels.score:.4f}",
                          fontsize=10)
    kernel_axes.legend(fontsize=7)

    contributions = kernels.query_term_contributions.numpy()
    term_axes.bar(range(len(terms)), contributions, color=["tab:green" if v >= 0 else "tab:red" for v in contributions])
    term_axes.axhline(0, color="black", linewidth=0.6)
    term_axes.set_xticks(range(len(terms)), terms, rotation=45, ha="right", fontsize=8)
    term_axes.set_title("Per query term: share of the score", fontsize=10)
    if title:
        figure.suptitle(title, fontsize=11)
    return _save(figure, path)


def text_segments(kernels: KernelScores, text: str) -> list[tuple[str, int | None, bool]]:
    """The document split into ``(piece, term index or None, read by the model)``: matching terms are their own
    pieces (found by the tokenizer's offsets; without offsets the pieces are the WordPiece terms themselves)."""
    if kernels.term_offsets is None:
        segments = []
        for index, token in enumerate(kernels.doc_tokens):
            if token.startswith("##"):
                segments.append((token[2:], index, True))
            else:
                if segments:
                    segments.append((" ", None, True))
                segments.append((token, index, True))
        return segments
    read_chars = len(text) if kernels.read_chars is None else kernels.read_chars
    segments, position = [], 0
    for index, (start, end) in enumerate(kernels.term_offsets):
        if start > position:
            segments.append((text[position:start], None, True))
        segments.append((text[start:end], index, True))
        position = max(position, end)
    if position < read_chars:
        segments.append((text[position:read_chars], None, True))
    if max(position, read_chars) < len(text):
        segments.append((text[max(position, read_chars):], None, False))
    return segments


def shaded_text(kernels: KernelScores, text: str, path: str | os.PathLike, title: str = "") -> Path:
    """The document text with each matching term shaded by its best match cosine (Figure 3's colouring);
    text beyond the model's length limit in grey."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LinearSegmentedColormap, Normalize

    best = kernels.best_match.tolist()
    atoms = []  # (string, shade or None, read) with whitespace atoms as " "
    for piece, term, read in text_segments(kernels, text):
        for word in _split_keep_spaces(piece):
            atoms.append((word, None if term is None else best[term], read))
    lines, line, column = [], [], 0
    for word, shade, read in atoms:
        if word == " ":
            if column:
                line.append((column, word, shade, read))
                column += 1
            continue
        if column + len(word) > TEXT_WIDTH_CHARS and column and line and line[-1][1] == " ":
            lines.append(line)
            line, column = [], 0
        line.append((column, word, shade, read))
        column += len(word)
    if line:
        lines.append(line)
    truncated = len(lines) > TEXT_MAX_LINES
    lines = lines[:TEXT_MAX_LINES]

    char_inch = 0.602 * TEXT_FONT_SIZE / 72
    line_inch = 1.75 * TEXT_FONT_SIZE / 72
    text_width = TEXT_WIDTH_CHARS * char_inch
    margin, bar_width, header = 0.25, 1.2, 0.55 if title else 0.25
    width = text_width + 2 * margin + bar_width
    height = header + line_inch * (len(lines) + 1 + truncated) + 0.3
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((margin / width, 0.3 / height, text_width / width, 1 - (header + 0.3) / height))
    axes.set_xlim(0, TEXT_WIDTH_CHARS)
    axes.set_ylim(len(lines) + truncated + 0.2, 0)
    axes.axis("off")
    for row, words in enumerate(lines):
        for column, word, shade, read in words:
            style = {"family": "monospace", "fontsize": TEXT_FONT_SIZE, "va": "center", "ha": "left",
                     "color": "black" if read else "0.6"}
            if shade is not None:
                style["bbox"] = {"boxstyle": "square,pad=0.12", "facecolor": match_color(shade), "edgecolor": "none"}
            axes.text(column, row + 0.6, word, **style)
    if truncated:
        axes.text(0, len(lines) + 0.6, "… (cut here; the HTML page and the JSON have the whole text)",
                  family="monospace", fontsize=TEXT_FONT_SIZE - 1, color="0.4", va="center")
    if title:
        figure.text(margin / width, 1 - 0.3 / height, title, fontsize=10, va="center")
    colour_axes = figure.add_axes(((margin * 1.6 + text_width) / width, 0.3 / height, 0.15 / width,
                                   min(2.2, height - header - 0.3) / height))
    cmap = LinearSegmentedColormap.from_list("match", [match_color(step / 15) for step in range(16)])
    figure.colorbar(ScalarMappable(Normalize(0, 1), cmap), cax=colour_axes, label="best match cosine")
    return _save(figure, path)


def _split_keep_spaces(piece: str) -> list[str]:
    """``"a  b\\nc"`` → ``["a", " ", "b", " ", "c"]``: words, with each whitespace run as one space."""
    words, current = [], ""
    for character in piece:
        if character.isspace():
            if current:
                words.append(current)
                current = ""
            if not words or words[-1] != " ":
                words.append(" ")
        else:
            current += character
    if current:
        words.append(current)
    return words


def comparison_bars(first: KernelScores, second: KernelScores, comparison: dict, path: str | os.PathLike,
                    labels: tuple[str, str]) -> Path:
    """Side by side: each kernel's share of the score for two documents, and the per-kernel (and per-query-term)
    differences that add up to the difference of their scores."""
    import numpy as np

    mus = first.kernel_mus
    positions = np.arange(len(mus))
    tick_labels = [f"{mu:g}" for mu in mus]
    has_terms = "query_term_differences" in comparison
    figure = _figure(13.0 if has_terms else 10.0, 4.2)
    axes = figure.subplots(1, 3 if has_terms else 2, width_ratios=[1.3, 1.0, 0.8] if has_terms else [1.3, 1.0])
    shares, differences = axes[0], axes[1]
    shares.bar(positions - 0.2, first.kernel_contributions.numpy(), 0.4, label=f"{labels[0]} ({first.score:.3f})",
               color="tab:blue")
    shares.bar(positions + 0.2, second.kernel_contributions.numpy(), 0.4, label=f"{labels[1]} ({second.score:.3f})",
               color="tab:gray")
    shares.axhline(0, color="black", linewidth=0.6)
    shares.set_xticks(positions, tick_labels)
    shares.set_xlabel("kernel μ")
    shares.set_title("Each kernel's share of the score (β·s^k_log + γ·s^k_len)", fontsize=10)
    shares.legend(fontsize=8)
    delta = np.asarray(comparison["kernel_differences"])
    differences.bar(positions, delta, color=["tab:green" if v >= 0 else "tab:red" for v in delta])
    differences.axhline(0, color="black", linewidth=0.6)
    differences.set_xticks(positions, tick_labels)
    differences.set_xlabel("kernel μ")
    differences.set_title(f"{labels[0]} − {labels[1]} per kernel (sum {comparison['score_difference']:+.4f})",
                          fontsize=10)
    if has_terms:
        term_delta = np.asarray(comparison["query_term_differences"])
        terms = comparison["query_tokens"]
        axes[2].bar(range(len(terms)), term_delta, color=["tab:green" if v >= 0 else "tab:red" for v in term_delta])
        axes[2].axhline(0, color="black", linewidth=0.6)
        axes[2].set_xticks(range(len(terms)), terms, rotation=45, ha="right", fontsize=8)
        axes[2].set_title("… per query term", fontsize=10)
    return _save(figure, path)

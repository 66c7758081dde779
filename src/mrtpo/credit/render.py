"""Render credit maps: a self-contained HTML page, a PNG for papers, and the terminal.

Every view has one row per reward (shaded by that reward's share of the advantage,
c_k * w_{k,t} * Ã_k), a combined row (MRTPO's A_t) and, when known, GDPO's uniform row; each
token is one box: blue for a positive advantage, red for a negative one, white for zero, on a
scale shared by all the rows of a map. A map without advantages (analysis replays) is shaded by
replay distance instead. A reward that was not replayed on a response (the trainer skips it where
its Ã_k is 0) says so beside its row and has no distance. The completion is untrusted text: everything is escaped, control
characters are shown as visible escapes, and whitespace as glyphs (↵ newline, ⇥ tab).
"""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mrtpo.credit.map import CreditMap

POSITIVE_RGB = (33, 102, 172)  # blue
NEGATIVE_RGB = (178, 24, 43)  # red
DISTANCE_RGB = (230, 120, 20)  # orange: replay distance, when there is no advantage to show
WHITE_RGB = (255, 255, 255)
_ESCAPED_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
_GLYPHS = {"\n": "↵", "\t": "⇥", "\r": "␍"}


# --- text: what a token shows ------------------------------------------------------------


def visible_pieces(text: str) -> list[tuple[str, str]]:
    """Split text into (piece, kind) with kind "text", "glyph" (whitespace shown as ↵ ⇥ ␍)
    or "escape" (a control / format / unassigned character shown as \\xNN, \\uNNNN)."""
    pieces: list[tuple[str, str]] = []
    for char in text:
        if char in _GLYPHS:
            piece, kind = _GLYPHS[char], "glyph"
        elif unicodedata.category(char) in _ESCAPED_CATEGORIES:
            piece, kind = char.encode("unicode_escape").decode("ascii"), "escape"
        else:
            piece, kind = char, "text"
        if pieces and pieces[-1][1] == kind == "text":
            pieces[-1] = (pieces[-1][0] + piece, kind)
        else:
            pieces.append((piece, kind))
    return pieces


def visible_text(text: str) -> str:
    return "".join(piece for piece, _ in visible_pieces(text))


def token_label(credit_map: CreditMap, t: int) -> str:
    """What token t shows (escaped for display, not yet for HTML)."""
    if credit_map.special_labels[t]:
        return visible_text(credit_map.special_labels[t])
    return visible_text(credit_map.token_text(t))


# --- rows and colours ----------------------------------------------------------------------


@dataclass
class Row:
    """One line of boxes: a label, a value per token, and the verdict beside it."""

    label: str
    values: np.ndarray  # [T]
    summary: str = ""  # score and advantage
    info: str = ""  # verifier information
    spans: tuple[tuple[int, int], ...] = ()
    kind: str = "reward"  # reward | combined | gdpo


def _format(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.3f}"


def map_rows(credit_map: CreditMap) -> tuple[list[Row], str]:
    """The rows of a map and what their values are ("advantage" or "distance")."""
    per_reward = credit_map.reward_token_advantages()
    mode = "distance" if per_reward is None and credit_map.token_advantages is None else "advantage"
    rows = []
    for k, (name, verdict) in enumerate(zip(credit_map.names, credit_map.verdicts, strict=True)):
        if credit_map.types[k] != name:
            name = f"{name} ({credit_map.types[k]})"
        score = "not applicable" if verdict.score is None else f"score {verdict.score:g}"
        summary = score
        if credit_map.reward_advantages is not None:
            summary += f", advantage Ã={_format(float(credit_map.reward_advantages[k]))}"
        if not credit_map.was_replayed(k):
            summary += ", not replayed"
        if mode == "advantage" and per_reward is not None:
            values = per_reward[k]
        elif mode == "advantage":
            values = np.zeros(credit_map.num_tokens)
        else:
            values = credit_map.distance[k]
        rows.append(Row(name, values, summary, verdict.info, tuple(verdict.spans), "reward"))
    if credit_map.token_advantages is not None:
        mean = float(credit_map.token_advantages.mean()) if credit_map.num_tokens else 0.0
        rows.append(
            Row(
                "MRTPO (combined)",
                credit_map.token_advantages,
                f"token mean {_format(mean)}",
                kind="combined",
            )
        )
    if credit_map.gdpo_advantage is not None:
        uniform = np.full(credit_map.num_tokens, credit_map.gdpo_advantage)
        rows.append(
            Row(
                "GDPO (uniform)",
                uniform,
                f"every token {_format(credit_map.gdpo_advantage)}",
                kind="gdpo",
            )
        )
    return rows, mode


def color_scale(rows: Sequence[Row]) -> float:
    """The largest |value| over the rows (1 when all are 0): the legend's end."""
    largest = max((float(np.abs(row.values).max()) for row in rows if row.values.size), default=0.0)
    return largest if largest > 0 else 1.0


def shade(value: float, scale: float, mode: str = "advantage") -> tuple[int, int, int]:
    """The background of a box: white at 0, full blue (red) at +scale (-scale)."""
    strength = min(abs(value) / scale, 1.0) if scale > 0 else 0.0
    if mode == "distance":
        end = DISTANCE_RGB
    else:
        end = POSITIVE_RGB if value > 0 else NEGATIVE_RGB
    return tuple(round(w + (e - w) * strength) for w, e in zip(WHITE_RGB, end, strict=True))


def _ink(background: tuple[int, int, int]) -> str:
    """Black or white text, whichever reads on the background."""
    luminance = 0.299 * background[0] + 0.587 * background[1] + 0.114 * background[2]
    return "#fff" if luminance < 140 else "#111"


# --- HTML -----------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,sans-serif;margin:1.5em;color:#111;background:#fff}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}
table.rows{border-collapse:collapse;width:100%;margin-top:.5em}
table.rows td,table.rows th{border-top:1px solid #ddd;padding:.4em;vertical-align:top}
th.label{text-align:left;width:11em;font-weight:600}
th.label small,td.info small{display:block;font-weight:400;color:#555}
td.tokens{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px;line-height:1.9}
td.info{width:22em;font-size:12px}
span.tok{display:inline-block;white-space:pre;border:1px solid #c8c8c8;border-radius:2px;
 padding:0 1px;margin:0 1px 1px 0;min-width:.5ch;line-height:1.4}
span.tok.frag{border-style:dashed;min-width:.4ch}
span.tok.special{font-style:italic;opacity:.8}
span.tok.read{border-bottom:3px solid #111}
span.glyph{opacity:.55}
span.esc{color:#8b008b;font-weight:600}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.5em;margin:.3em 0;max-height:20em;overflow:auto}
.legend{display:flex;align-items:center;gap:.5em;font-size:12px;margin:.3em 0}
.legend .bar{width:16em;height:12px;border:1px solid #999}
.note{font-size:12px;color:#555}
table.index{border-collapse:collapse}table.index td,table.index th{border:1px solid #ccc;padding:.3em .6em}
"""


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def _pieces_html(text: str) -> str:
    parts = []
    for piece, kind in visible_pieces(text):
        if kind == "text":
            parts.append(_escape(piece))
        else:
            css = "glyph" if kind == "glyph" else "esc"
            parts.append(f'<span class="{css}">{_escape(piece)}</span>')
    return "".join(parts)


def _token_tooltip(credit_map: CreditMap, row: Row, t: int, row_index: int) -> str:
    if credit_map.special_labels[t]:
        what = f"special token {credit_map.special_labels[t]!r}"
    elif credit_map.is_fragment[t]:
        what = "byte fragment (the character completes in a following token)"
    else:
        what = repr(credit_map.token_text(t))
    lines = [f"token {t}: {what}", f"value {row.values[t]:+.4f}"]
    if row.kind == "reward" and not credit_map.was_replayed(row_index):
        lines.append("not replayed: no distance measured")
    elif row.kind == "reward":
        lines.append(f"replay distance q {credit_map.distance[row_index, t]:.4f}")
        if credit_map.weights is not None:
            lines.append(f"weight w {credit_map.weights[row_index, t]:.3f}")
    return "\n".join(lines)


def _legend_html(scale: float, mode: str) -> str:
    if mode == "distance":
        end = "rgb({},{},{})".format(*DISTANCE_RGB)
        return (
            f'<div class="legend"><span>0</span><span class="bar" style="background:linear-gradient(to right,#fff,{end})">'
            f"</span><span>{scale:.3f}</span><span>replay distance q</span></div>"
        )
    low, high = "rgb({},{},{})".format(*NEGATIVE_RGB), "rgb({},{},{})".format(*POSITIVE_RGB)
    return (
        f'<div class="legend"><span>{-scale:+.3f}</span><span class="bar" '
        f'style="background:linear-gradient(to right,{low},#fff,{high})"></span>'
        f"<span>{scale:+.3f}</span><span>advantage: red negative, white 0, blue positive</span></div>"
    )


def _row_html(credit_map: CreditMap, row: Row, row_index: int, scale: float, mode: str) -> str:
    read = (
        credit_map.tokens_in_spans(row.spans)
        if row.spans
        else np.zeros(credit_map.num_tokens, bool)
    )
    boxes = []
    for t in range(credit_map.num_tokens):
        background = shade(float(row.values[t]), scale, mode)
        classes = ["tok"]
        if credit_map.is_fragment[t]:
            classes.append("frag")
        if credit_map.special_labels[t]:
            classes.append("special")
        if read[t]:
            classes.append("read")
        label = credit_map.special_labels[t] or credit_map.token_text(t)
        style = "background:rgb({},{},{});color:{}".format(*background, _ink(background))
        tooltip = _escape(_token_tooltip(credit_map, row, t, row_index))
        box = f'<span class="{" ".join(classes)}" style="{style}" title="{tooltip}">{_pieces_html(label)}</span>'
        # a newline in the response also breaks the line of boxes (after the ↵ box)
        newlines = 0 if credit_map.special_labels[t] else label.count("\n")
        boxes.append(box + "<br>" * newlines + "<wbr>")
    info = ""
    if row.kind == "reward":
        spans = ", ".join(f"{a}–{b}" for a, b in row.spans[:8]) or "none"
        if len(row.spans) > 8:
            spans += f", … ({len(row.spans)} ranges)"
        info = (
            f"<small>characters read: {_escape(spans)} (underlined)</small>"
            f"<details><summary>verifier information</summary><pre>{_pieces_html(row.info)}</pre></details>"
        )
    return (
        f'<tr class="row {row.kind}"><th class="label">{_escape(row.label)}<small>{_escape(row.summary)}</small></th>'
        f'<td class="tokens">{"".join(boxes)}</td><td class="info">{info}</td></tr>'
    )


def _map_html(credit_map: CreditMap, number: int) -> str:
    rows, mode = map_rows(credit_map)
    scale = color_scale(rows)
    heading = credit_map.title or f"Response {number}"
    parts = [f'<section class="map"><h2>{_escape(heading)}</h2>', _legend_html(scale, mode)]
    if credit_map.prompt:
        parts.append(
            f"<details><summary>prompt</summary><pre>{_pieces_html(credit_map.prompt)}</pre></details>"
        )
    parts.append('<table class="rows">')
    parts += [_row_html(credit_map, row, i, scale, mode) for i, row in enumerate(rows)]
    parts.append("</table></section>")
    return "".join(parts)


def to_html(
    maps: CreditMap | Sequence[CreditMap],
    title: str = "Credit map",
    diagnostics: Mapping[str, float | str | None] | None = None,
) -> str:
    """A self-contained HTML page (inline CSS, no script) with one section per map; with
    `diagnostics` (a training step's figures, see `write_training_maps`) a one-row table of
    them above the maps."""
    maps = [maps] if isinstance(maps, CreditMap) else list(maps)
    note = (
        "Each reward row shades a token by that reward's share of the advantage "
        "(c<sub>k</sub>·w<sub>k,t</sub>·Ã<sub>k</sub>); the combined row is MRTPO's per-token advantage "
        "A<sub>t</sub>; GDPO gives every token the same advantage. Boxes are tokens (dashed: a byte "
        "fragment of a character), underlined tokens are the ones the verifier read; hover a box for its numbers. "
        'A reward marked "not replayed" has Ã<sub>k</sub> = 0 on that response: it adds nothing to the '
        "advantage, so its contexts were not replayed and it has no measured distance."
    )
    body = "".join(_map_html(credit_map, i + 1) for i, credit_map in enumerate(maps))
    figures = ""
    if diagnostics:
        header = "".join(f"<th>{_escape(name)}</th>" for name in diagnostics)
        cells = "".join(f"<td>{_figure(value)}</td>" for value in diagnostics.values())
        figures = f'<table class="index"><tr>{header}</tr><tr>{cells}</tr></table>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>{_escape(title)}</h1><p class="note">{note}</p>{figures}{body}</body></html>\n'
    )


def _figure(value: float | str | None) -> str:
    """A diagnostic in a table cell: 4 significant digits; "–" where None or NaN."""
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, str):  # "inf" / "-inf", as index.json stores them
        return _escape(value)
    return f"{value:.4g}"


def index_html(steps: Sequence[dict[str, Any]]) -> str:
    """The index of training credit maps: one line per step with each reward's mean score and
    the step's diagnostics."""
    names = sorted({name for entry in steps for name in entry["rewards"]})
    # The steps' diagnostics in their first appearance's order (older index.json: none).
    figures = list(dict.fromkeys(n for entry in steps for n in entry.get("diagnostics", {})))
    header = "".join(f"<th>{_escape(name)}</th>" for name in [*names, *figures])
    lines = []
    for entry in steps:
        cells = "".join(
            f"<td>{entry['rewards'][name]:.3f}</td>" if name in entry["rewards"] else "<td>–</td>"
            for name in names
        )
        cells += "".join(
            f"<td>{_figure(entry.get('diagnostics', {}).get(name))}</td>" for name in figures
        )
        link = _escape(entry["page"])
        lines.append(
            f'<tr><td><a href="{link}">step {int(entry["step"])}</a></td><td>{int(entry["rows"])}</td>{cells}</tr>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Credit maps</title>'
        f"<style>{_CSS}</style></head><body><h1>Credit maps during training</h1>"
        '<p class="note">Mean reward score over the rows shown at each step, then the step\'s '
        "figures: MRTPO's beta, its re-allocation ratio and, under automatic beta, the "
        "agreement beta moves on (mean, standard error, lower bound, probes).</p>"
        f'<table class="index"><tr><th>step</th><th>rows</th>{header}</tr>{"".join(lines)}</table></body></html>\n'
    )


# --- PNG ------------------------------------------------------------------------------------

_PNG_COLUMNS = 96  # characters per line of boxes
_CHAR_INCHES = 0.072  # width of one monospace character at 8 pt
_LINE_INCHES = 0.24


def _font_charmap() -> set[int]:
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    return set(FT2Font(font_manager.findfont("DejaVu Sans Mono")).get_charmap())


def _png_label(label: str, charmap: set[int]) -> str:
    """A label the font can draw: characters it lacks become □."""
    return "".join(char if ord(char) in charmap else "□" for char in visible_text(label))


def to_png(credit_map: CreditMap, path: str | Path, dpi: int = 150) -> Path:
    """Draw the map (same rows, shading and scale as the HTML) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.patches import Rectangle

    rows, mode = map_rows(credit_map)
    scale = color_scale(rows)
    charmap = _font_charmap()
    labels = []
    for t in range(credit_map.num_tokens):
        label = credit_map.special_labels[t] or credit_map.token_text(t)
        labels.append(
            (_png_label(label, charmap), 0 if credit_map.special_labels[t] else label.count("\n"))
        )

    # Lay the boxes out once (all rows share it): (line, column, width) per token.
    layout, line, column = [], 0, 0.0
    for text, newlines in labels:
        width = max(len(text), 0.5)
        if column + width > _PNG_COLUMNS and column > 0:
            line, column = line + 1, 0.0
        layout.append((line, column, width))
        column += width + 0.25
        if newlines:
            line, column = line + newlines, 0.0
    lines_per_row = (layout[-1][0] + 1 if layout else 1) + 1.6  # + the row's heading

    total_lines = lines_per_row * len(rows)
    height = total_lines * _LINE_INCHES + 0.9  # + the colour bar on top
    figure = plt.figure(figsize=(_PNG_COLUMNS * _CHAR_INCHES + 0.6, height))
    axes = figure.add_axes((0.01, 0.0, 0.98, 1.0 - 0.9 / height))
    axes.set_xlim(0, _PNG_COLUMNS)
    axes.set_ylim(total_lines, 0)
    axes.axis("off")
    read_masks = [credit_map.tokens_in_spans(row.spans) for row in rows]
    for r, row in enumerate(rows):
        top = r * lines_per_row
        axes.text(
            0,
            top + 0.55,
            f"{row.label}: {row.summary}",
            fontsize=8,
            fontweight="bold",
            va="center",
            parse_math=False,
        )
        for t, ((text, _), (line, column, width)) in enumerate(zip(labels, layout, strict=True)):
            y = top + 1.2 + line
            background = shade(float(row.values[t]), scale, mode)
            axes.add_patch(
                Rectangle(
                    (column, y),
                    width,
                    0.85,
                    facecolor=tuple(c / 255 for c in background),
                    edgecolor="#111" if read_masks[r][t] else "#bbbbbb",
                    linewidth=0.9 if read_masks[r][t] else 0.4,
                    linestyle="--" if credit_map.is_fragment[t] else "-",
                )
            )
            if text:
                axes.text(
                    column + 0.02,
                    y + 0.45,
                    text,
                    fontsize=8.5,
                    family="DejaVu Sans Mono",
                    va="center",
                    color=_ink(background),
                    parse_math=False,
                )
    if mode == "distance":
        colormap = LinearSegmentedColormap.from_list(
            "distance", [(1, 1, 1), tuple(c / 255 for c in DISTANCE_RGB)]
        )
        norm, caption = Normalize(0, scale), "replay distance q"
    else:
        colormap = LinearSegmentedColormap.from_list(
            "advantage",
            [tuple(c / 255 for c in NEGATIVE_RGB), (1, 1, 1), tuple(c / 255 for c in POSITIVE_RGB)],
        )
        norm, caption = Normalize(-scale, scale), "advantage (red negative, blue positive)"
    bar_axes = figure.add_axes((0.3, 1.0 - 0.35 / height, 0.4, 0.1 / height))
    bar = figure.colorbar(
        plt.cm.ScalarMappable(norm=norm, cmap=colormap), cax=bar_axes, orientation="horizontal"
    )
    bar.set_label(caption, fontsize=7)
    bar.ax.tick_params(labelsize=6)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path


# --- terminal -------------------------------------------------------------------------------


def to_terminal(credit_map: CreditMap, console: Any = None) -> None:
    """Print the map with rich: each token on its shade (colour only on a terminal;
    every other token underlined so boundaries show)."""
    from rich.console import Console
    from rich.style import Style
    from rich.text import Text

    console = console or Console(highlight=False)
    rows, mode = map_rows(credit_map)
    scale = color_scale(rows)
    legend = "blue > 0 > red" if mode == "advantage" else "replay distance, white 0 to orange"
    console.print(
        Text(f"{credit_map.title or 'credit map'}  (scale ±{scale:.3f}, {legend})", style="bold")
    )
    for row in rows:
        line = Text(f"{row.label}: {row.summary}\n", style="bold")
        for t in range(credit_map.num_tokens):
            background = shade(float(row.values[t]), scale, mode)
            style = Style(
                bgcolor=f"rgb({background[0]},{background[1]},{background[2]})",
                color="white" if _ink(background) == "#fff" else "black",
                underline=t % 2 == 1,
                italic=bool(credit_map.special_labels[t]),
            )
            label = credit_map.special_labels[t] or credit_map.token_text(t)
            line.append(visible_text(label), style=style)  # a byte fragment shows nothing
            if not credit_map.special_labels[t] and "\n" in label:
                line.append("\n" * label.count("\n"))
        console.print(line)

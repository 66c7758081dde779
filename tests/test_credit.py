"""Credit maps: token offsets, the localization and concentration numbers, and safe rendering."""

from __future__ import annotations

import io
import json
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from mrtpo.credit import CreditMap, token_offsets, write_training_maps
from mrtpo.credit.analysis import (
    character_parts,
    concentration,
    concentration_markdown,
    concentration_png,
    localization_markdown,
    localization_table,
    token_parts,
)
from mrtpo.credit.render import to_html, to_png, to_terminal, visible_text
from mrtpo.credit.replay import group_credit_map
from mrtpo.verifiers import Verdict


def hand_map(tokens, distance, verdicts, names=None, **kwargs) -> CreditMap:
    """A map from token strings (their concatenation is the completion text)."""
    names = names or [f"r{k}" for k in range(len(verdicts))]
    record = {"tokens": tokens, "names": names, "distance": distance, "verdicts": verdicts}
    return CreditMap.from_record({**record, **kwargs})


# --------------------------------------------------------------------------- token offsets


def test_offsets_merge_byte_fragments_of_an_emoji(tiny):
    _, tokenizer = tiny
    text = "Hi 😀 é"
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    decoded, offsets, is_fragment, special = token_offsets(tokenizer, ids)
    assert decoded == text
    pieces = [decoded[a:b] for a, b in offsets]
    assert "".join(pieces) == text
    # the emoji is 4 UTF-8 bytes; the tiny byte-level BPE keeps them as 4 tokens: the first
    # three end inside the character, the fourth completes it
    emoji_token = pieces.index("😀")
    assert is_fragment[emoji_token - 3 : emoji_token] == [True, True, True]
    assert pieces[emoji_token - 3 : emoji_token] == ["", "", ""]
    assert not is_fragment[emoji_token]
    assert "\ufffd" not in "".join(pieces)
    assert special[-1] == "<|im_end|>" and offsets[-1] == (len(text), len(text))


def test_offsets_tile_a_longer_text(tiny):
    _, tokenizer = tiny
    text = "SELECT name FROM singer WHERE age >= 30;\n\t<answer>ok</answer> über"
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoded, offsets, is_fragment, _ = token_offsets(tokenizer, ids)
    assert decoded == text
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:], strict=False))
    # a piece is what its token decodes to alone, except "ü" which gathers its two bytes
    pieces = [text[start:end] for start, end in offsets]
    for t, token_id in enumerate(ids):
        if t > 0 and is_fragment[t - 1]:
            assert pieces[t] == "ü" and tokenizer.decode(ids[t - 1 : t + 1]) == "ü"
        elif not is_fragment[t]:
            assert pieces[t] == tokenizer.decode([token_id])
    assert is_fragment.count(True) == 1


def test_from_replay_cuts_padding_and_checks_shapes(tiny):
    _, tokenizer = tiny
    ids = tokenizer.encode("SELECT 1", add_special_tokens=False)
    length = len(ids)
    padded = ids + [tokenizer.pad_token_id] * 3
    mask = [1] * length + [0] * 3
    distance = np.arange(2 * (length + 3), dtype=float).reshape(2, length + 3) / 100
    credit_map = CreditMap.from_replay(
        tokenizer, padded, ["a", "b"], distance, verdicts=[Verdict(1.0, "")] * 2, mask=mask
    )
    assert credit_map.num_tokens == length
    np.testing.assert_allclose(credit_map.distance, distance[:, :length])
    with pytest.raises(ValueError, match="distance"):
        CreditMap.from_replay(tokenizer, ids, ["a"], distance, verdicts=[Verdict(1.0, "")])


def test_reward_token_advantages_are_c_w_a():
    weights = np.array([[1.5, 0.5, 1.0], [0.8, 1.2, 1.0]])
    credit_map = hand_map(
        ["a", "b", "c"],
        np.full((2, 3), 0.1),
        [Verdict(1.0, ""), Verdict(0.0, "")],
        weights=weights,
        reward_advantages=[2.0, -1.0],
        reward_weights=[1.0, 0.5],
    )
    expected = np.array([[3.0, 1.0, 2.0], [-0.4, -0.6, -0.5]])
    np.testing.assert_allclose(credit_map.reward_token_advantages(), expected)


# --------------------------------------------------------------------------- group maps


def test_group_map_has_the_groups_advantages_and_drops_rewards_that_do_not_apply(tiny):
    _, tokenizer = tiny
    text = "Hello there"
    ids = tokenizer.encode(text, add_special_tokens=False)
    scores = [[1.0, 0.0, None], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]  # [G, K], row 0 explained
    verdicts = [[Verdict(score, "", ()) for score in line] for line in scores]
    distance = torch.rand(3, len(ids), generator=torch.Generator().manual_seed(0))
    credit_map = group_credit_map(
        tokenizer, ids, text, ["a", "b", "c"], verdicts, distance, beta=0.5, title="t"
    )
    assert credit_map.names == ["a", "b"]  # c is None on the explained response
    np.testing.assert_allclose(credit_map.distance, distance[:2].numpy(), atol=1e-6)
    # Ã_k by hand: (r_0 - mean) / (Bessel std + 1e-4) over the group of 3
    group = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    expected = (group[0] - group.mean(axis=0)) / (group.std(axis=0, ddof=1) + 1e-4)
    np.testing.assert_allclose(credit_map.reward_advantages, expected, atol=1e-6)
    assert credit_map.token_advantages.mean() == pytest.approx(credit_map.gdpo_advantage, abs=1e-6)
    assert credit_map.title == "t, in a group of 3 (beta 0.5)"


def test_group_map_of_one_response_holds_distances_only(tiny):
    _, tokenizer = tiny
    ids = tokenizer.encode("Hi", add_special_tokens=False)
    verdicts = [[Verdict(1.0, "", ())]]
    credit_map = group_credit_map(tokenizer, ids, "Hi", ["a"], verdicts, torch.ones(1, len(ids)))
    assert credit_map.reward_advantages is None and credit_map.token_advantages is None
    assert credit_map.title == ", replay distances"
    with pytest.raises(ValueError, match=r"distance must have shape \(K, T\)"):
        group_credit_map(tokenizer, ids, "Hi", ["a"], verdicts, torch.ones(2, len(ids)))
    with pytest.raises(ValueError, match="at least the explained response"):
        group_credit_map(tokenizer, ids, "Hi", ["a"], [], torch.ones(1, len(ids)))


# --------------------------------------------------------------------------- localization

# "<a>x y</a> z": the checker reads "x y" (characters 3..6) = tokens 1 and 2 of 5.
TOKENS = ["<a>", "x", " y", "</a>", " z"]


def test_localization_by_hand():
    satisfied = [
        # dist on read tokens 0.4 + 0.2 = 0.6 of 1.0 -> Dist 60, Tok 40, ratio 1.5
        hand_map(TOKENS, [[0.1, 0.4, 0.2, 0.1, 0.2]], [Verdict(1.0, "", ((3, 6),))]),
        # 0.1 + 0.3 = 0.4 of 1.0 -> Dist 40, Tok 40, ratio 1
        hand_map(TOKENS, [[0.2, 0.1, 0.3, 0.2, 0.2]], [Verdict(1.0, "", ((3, 6),))]),
    ]
    violated = [
        # reads only " z" (10..12) = token 4: 0.5 of 0.8 -> Dist 62.5, Tok 20
        hand_map(TOKENS, [[0.1, 0.1, 0.0, 0.1, 0.5]], [Verdict(0.0, "", ((10, 12),))]),
    ]
    excluded = [
        hand_map(TOKENS, [[0.2] * 5], [Verdict(0.0, "", ())]),  # no spans
        hand_map(TOKENS, [[0.2] * 5], [Verdict(1.0, "", ((0, 12),))]),  # reads everything
        hand_map(TOKENS, [[0.0] * 5], [Verdict(1.0, "", ((3, 6),))]),  # zero distance
        hand_map(TOKENS, [[0.2] * 5], [Verdict(None, "", ((3, 6),))]),  # not applicable
    ]
    rows = localization_table(satisfied + violated + excluded, min_instances=2)
    by_key = {(row["type"], row["outcome"]): row for row in rows}
    row = by_key[("r0", "satisfied")]
    assert row["n"] == 2 and row["excluded"] == 2 and row["enough"]
    assert row["dist"] == pytest.approx(50.0)
    assert row["tok"] == pytest.approx(40.0)
    assert row["ratio"] == pytest.approx(50.0 / 40.0)
    assert row["mean_instance_ratio"] == pytest.approx((1.5 + 1.0) / 2)
    row = by_key[("r0", "violated")]
    assert (row["n"], row["excluded"], row["enough"]) == (1, 1, False)
    assert row["dist"] == pytest.approx(62.5) and row["tok"] == pytest.approx(20.0)
    assert row["ratio"] == pytest.approx(3.125)
    assert by_key[("all", "satisfied")]["dist"] == pytest.approx(50.0)
    assert by_key[("all", "violated")]["n"] == 1
    assert [r["type"] for r in rows[-2:]] == ["all", "all"]

    markdown = localization_markdown(rows)
    assert "| r0 | satisfied | 50.0 | 40.0 | 1.25 | 2 | 2 |" in markdown
    assert "| r0 | violated | – | – | – | 1 | 1 |" in markdown  # fewer than min_instances
    assert "| **all satisfied** |  | 50.0 | 40.0 | 1.25 | 2 | 2 |" in markdown


def test_localization_pools_types_and_maps_fragments_to_their_character(tiny):
    _, tokenizer = tiny
    text = "ok 😀 ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    num_tokens = len(ids)
    distance = np.zeros((1, num_tokens))
    credit_map = CreditMap.from_replay(
        tokenizer, ids, ["emoji"], distance, verdicts=[Verdict(1.0, "", ((3, 4),))]
    )
    read = credit_map.tokens_in_spans(((3, 4),))
    # the emoji's 3 fragments and the token completing it stand for character 3
    assert int(read.sum()) == 4
    assert [credit_map.token_text(t) for t in np.flatnonzero(read)] == ["", "", "", "😀"]


def test_localization_excludes_a_check_that_reads_the_whole_text(tiny):
    _, tokenizer = tiny
    text = "SELECT name"
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    distance = np.full((2, len(ids)), 0.1)
    verdicts = [Verdict(1.0, "", ((0, len(text)),)), Verdict(1.0, "", ((0, 6),))]
    credit_map = CreditMap.from_replay(
        tokenizer, ids, ["whole", "part"], distance, verdicts=verdicts
    )
    read = credit_map.tokens_in_spans(verdicts[1].spans)
    rows = {row["type"]: row for row in localization_table([credit_map], min_instances=1)}
    # the eos token stands for no character: reading all the text is reading everything
    assert (rows["whole"]["n"], rows["whole"]["excluded"]) == (0, 1)
    assert rows["part"]["n"] == 1
    assert rows["part"]["tok"] == pytest.approx(100 * read.sum() / len(ids))
    assert rows["part"]["ratio"] == pytest.approx(1.0)  # uniform distance: Dist. = Tok.


# --------------------------------------------------------------------------- concentration


def test_concentration_by_hand():
    # 10 tokens; distance sorted: 0.4, 0.2, 0.1, 0.1, 0.05 x4, 0.0  (total 1.0)
    tokens = ["<think>", "a", "b", "</think>", "<answer>", "c", "d", "</answer>", "e", "f"]
    distance = [[0.05, 0.4, 0.05, 0.05, 0.05, 0.2, 0.1, 0.1, 0.0, 0.0]]
    first = hand_map(tokens, distance, [Verdict(1.0, "")], names=["format"])
    # a second response: all its distance on one token of 4
    second = hand_map(
        ["<think>", "x", "</think>", "y"],
        [[0.0, 1.0, 0.0, 0.0]],
        [Verdict(0.0, "")],
        names=["format"],
    )
    assert token_parts(first) == [
        "tags",
        "reasoning",
        "reasoning",
        "tags",
        "tags",
        "answer",
        "answer",
        "tags",
        "other",
        "other",
    ]
    result = concentration([first, second])
    entry = result["rewards"]["format"]
    assert entry["n"] == 2
    # top 1% and 5% and 10% of 10 tokens: 1 token -> 40%; of 4 tokens: 1 token -> 100%
    assert entry["top"]["top 1%"] == pytest.approx((40 + 100) / 2)
    assert entry["top"]["top 10%"] == pytest.approx((40 + 100) / 2)
    # top 20%: 2 of 10 tokens -> 60%; ceil(0.8) = 1 of 4 -> 100%
    assert entry["top"]["top 20%"] == pytest.approx((60 + 100) / 2)
    assert entry["top_uniform"]["top 20%"] == pytest.approx((20 + 25) / 2)
    # parts: first: tags 0.05*3+0.1=0.25, reasoning 0.45, answer 0.3, other 0;
    # second: reasoning 1.0
    assert entry["parts"]["tags"] == pytest.approx((25 + 0) / 2)
    assert entry["parts"]["reasoning"] == pytest.approx((45 + 100) / 2)
    assert entry["parts"]["answer"] == pytest.approx((30 + 0) / 2)
    assert entry["parts_uniform"]["tags"] == pytest.approx((40 + 50) / 2)
    assert entry["parts_uniform"]["other"] == pytest.approx((20 + 25) / 2)
    assert result["all"]["top"] == entry["top"]
    markdown = concentration_markdown(result)
    assert "| format | 2 | 70.0 | 70.0 | 70.0 | 80.0 |" in markdown


def test_character_parts_need_a_closing_tag():
    text = "<<Title>> <think>r</think><call>c</call>"
    parts = character_parts(text)
    assert parts[:10] == ["other"] * 10  # "<Title>" has no "</Title>": prose
    assert parts[text.index("r")] == "reasoning"
    assert parts[text.index("c</call>")] == "answer"
    assert parts[text.index("</call>")] == "tags"


def test_concentration_png_and_prose_without_parts(tmp_path):
    credit_map = hand_map(TOKENS, [[0.1, 0.4, 0.2, 0.1, 0.2]], [Verdict(1.0, "")])
    path = concentration_png(concentration([credit_map]), tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prose = concentration(
        [hand_map(["No", " tags", " here"], [[0.2, 0.5, 0.3]], [Verdict(1.0, "")])]
    )
    assert prose["all"]["parts"]["other"] == pytest.approx(100.0)
    assert "| tags |" not in concentration_markdown(prose)
    assert "Every token is in one part of the response (other)" in concentration_markdown(prose)
    assert concentration_png(prose, tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- rendering


class BoxCounter(HTMLParser):
    """Counts token boxes per row and collects each box's text; records every tag seen."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.tags: list[tuple[str, list]] = []
        self.depth_in_box = 0
        self.titles: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        attributes = dict(attrs)
        if tag == "tr" and "row" in (attributes.get("class") or "").split():
            self.rows.append([])
        if tag == "span" and self.depth_in_box:
            self.depth_in_box += 1
        elif tag == "span" and "tok" in (attributes.get("class") or "").split():
            self.depth_in_box = 1
            self.rows[-1].append("")
            self.titles.append(attributes.get("title", ""))

    def handle_endtag(self, tag):
        if tag == "span" and self.depth_in_box:
            self.depth_in_box -= 1

    def handle_data(self, data):
        if self.depth_in_box:
            self.rows[-1][-1] += data


NASTY = 'Hi 😀 <script>alert("x")</script> & \'q\' "dq"\x07\x1b[2J\u202e end\n\tnext'


def nasty_map(tiny) -> CreditMap:
    _, tokenizer = tiny
    ids = tokenizer.encode(NASTY, add_special_tokens=False) + [tokenizer.eos_token_id]
    num_tokens = len(ids)
    rng = np.random.default_rng(0)
    distance = rng.random((2, num_tokens))
    weights = 0.5 + 0.5 * distance / distance.mean(axis=1, keepdims=True)
    reward_advantages = np.array([1.0, -0.5])
    return CreditMap.from_replay(
        tokenizer,
        ids,
        ["format <b>", 'exec "x"'],
        distance,
        weights,
        reward_advantages,
        (reward_advantages[:, None] * weights).sum(axis=0),
        [
            Verdict(1.0, '<img src=x onerror="alert(1)">', ((0, 2),)),
            Verdict(0.0, "error & </pre><script>bad()</script>\x00", ()),
        ],
        text=NASTY,
        gdpo_advantage=0.5,
        prompt="<prompt> & 'quotes'",
        title="<title>",
    )


PAGE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "p",
    "sub",
    "section",
    "div",
    "span",
    "details",
    "summary",
    "pre",
    "table",
    "tr",
    "th",
    "td",
    "small",
    "wbr",
    "br",
}


def test_html_escapes_lone_surrogates_and_separators():
    tokens = ["a\ud800", "\u2028", "\x7f", "<", "\ue000"]
    page = to_html(hand_map(tokens, [[0.1] * 5], [Verdict(1.0, "\udc80")]))
    page.encode("utf-8")
    for escaped in ("\\ud800", "\\u2028", "\\x7f", "&lt;", "\\ue000", "\\udc80"):
        assert escaped in page


def test_html_escapes_everything_and_has_one_box_per_token_per_row(tiny):
    credit_map = nasty_map(tiny)
    page = to_html([credit_map, credit_map], title="<x> & y")
    page.encode("utf-8")  # a lone surrogate in the text must not reach the page
    parser = BoxCounter()
    parser.feed(page)
    parser.close()
    assert {tag for tag, _ in parser.tags} <= PAGE_TAGS  # no <script>, <img>, <b>, <prompt>
    assert [tag for tag, _ in parser.tags].count("title") == 1  # only the page's own <title>
    assert not any(name.startswith("on") for _, attrs in parser.tags for name, _ in attrs)
    for raw in ("\x07", "\x1b", "\u202e", "\x00", "\ufffd"):
        assert raw not in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    # 2 maps x (2 rewards + combined + GDPO) rows, each exactly one box per token
    assert len(parser.rows) == 8
    assert all(len(row) == credit_map.num_tokens for row in parser.rows)
    # the boxes read back the response, whitespace as glyphs and controls as escapes
    expected = visible_text(NASTY) + "<|im_end|>"
    assert all("".join(row) == expected for row in parser.rows)
    assert "\\x07" in expected and "\\x1b" in expected and "\\u202e" in expected
    assert "↵" in expected and "⇥" in expected
    # byte fragments are empty boxes, the token completing the character holds it whole:
    # 3 for the emoji (4 bytes), 2 for U+202E (3 bytes)
    assert parser.rows[0].count("😀") == 1 and parser.rows[0].count("\\u202e") == 1
    fragments = [t for t, fragment in enumerate(credit_map.is_fragment) if fragment]
    assert len(fragments) == 5 and all(parser.rows[0][t] == "" for t in fragments)


def test_png_and_terminal(tiny, tmp_path):
    credit_map = nasty_map(tiny)
    path = to_png(credit_map, tmp_path / "map.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from rich.console import Console

    buffer = io.StringIO()
    to_terminal(
        credit_map, Console(file=buffer, force_terminal=True, color_system="truecolor", width=200)
    )
    output = buffer.getvalue()
    assert "\x1b[" in output  # colored
    assert "\x1b[2J" not in output  # the response's own escape sequence is shown, not run
    assert "format <b>" in output
    plain = io.StringIO()
    to_terminal(credit_map, Console(file=plain, force_terminal=False, width=200))
    assert "\x1b" not in plain.getvalue()
    assert "\\x1b[2J" in plain.getvalue() and visible_text("end\n") in plain.getvalue()


def test_distance_only_map_is_shaded_by_distance():
    credit_map = hand_map(TOKENS, [[0.0, 0.5, 0.25, 0.0, 0.0]], [Verdict(1.0, "info")])
    page = to_html(credit_map)
    assert "replay distance q" in page
    assert "background:rgb(255,255,255)" in page and "background:rgb(230,120,20)" in page


def test_write_training_maps(tiny, tmp_path):
    _, tokenizer = tiny
    ids = tokenizer.encode("<answer>SELECT 1</answer>", add_special_tokens=False)
    num_tokens = len(ids)
    record = {
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "list <all>"}],
        "completion_ids": ids,
        "tokenizer": tokenizer,
        "names": ["format", "execution"],
        "distance": np.full((2, num_tokens), 0.1),
        "weights": np.ones((2, num_tokens)),
        "reward_advantages": [0.7, -0.7],
        "token_advantages": np.zeros(num_tokens),
        "verdicts": [Verdict(1.0, "fmt"), Verdict(0.0, "exec")],
        "gdpo_advantage": 0.0,
        "title": "lowest",
    }
    write_training_maps(tmp_path, 5, [record])
    second = {**record, "verdicts": [Verdict(1.0, "fmt"), Verdict(1.0, "exec")]}
    page = write_training_maps(tmp_path, 10, [record, second])
    assert page == tmp_path / "credit" / "step-00010.html"
    assert "list &lt;all&gt;" in page.read_text()
    index = (tmp_path / "credit" / "index.html").read_text()
    assert 'href="step-00005.html"' in index and 'href="step-00010.html"' in index
    steps = json.loads((tmp_path / "credit" / "index.json").read_text())
    assert [entry["step"] for entry in steps] == [5, 10]
    assert steps[1]["rewards"] == {"format": 1.0, "execution": 0.5}
    write_training_maps(tmp_path, 5, [second])  # a step written again replaces its entry
    steps = json.loads((tmp_path / "credit" / "index.json").read_text())
    assert [entry["step"] for entry in steps] == [5, 10] and steps[0]["rewards"]["execution"] == 1.0


def test_training_maps_show_the_steps_diagnostics(tmp_path):
    """The step's figures above its maps and as the index's columns; strict JSON keeps an
    infinite ratio as "inf" and a NaN as null, both shown; a step without them shows "–"."""
    tokens = ["a", "b"]
    credit_map = hand_map(tokens, [[0.5, 0.25]], [Verdict(1.0, "info")])
    credit_dir = tmp_path / "credit"
    write_training_maps(tmp_path, 0, [credit_map])  # no diagnostics (a GDPO run's)
    figures = {"beta": 0.3, "reallocation_ratio": float("inf"), "agreement": 0.012345678}
    page = write_training_maps(tmp_path, 4, [credit_map], {**figures, "agreement_se": float("nan")})
    steps = json.loads((credit_dir / "index.json").read_text())
    assert steps[0]["diagnostics"] == {}
    assert steps[1]["diagnostics"] == {
        "beta": 0.3, "reallocation_ratio": "inf", "agreement": 0.012345678, "agreement_se": None
    }  # fmt: skip
    row = "<tr><th>beta</th><th>reallocation_ratio</th><th>agreement</th><th>agreement_se</th></tr>"
    assert row + "<tr><td>0.3</td><td>inf</td><td>0.01235</td><td>–</td></tr>" in page.read_text()
    index = (credit_dir / "index.html").read_text()
    assert "<th>r0</th><th>beta</th><th>reallocation_ratio</th>" in index
    assert "<td>1.000</td><td>–</td><td>–</td><td>–</td><td>–</td></tr>" in index  # step 0
    assert "<td>1.000</td><td>0.3</td><td>inf</td><td>0.01235</td><td>–</td></tr>" in index

"""`mrtpo explain` and `mrtpo analyze` on the tiny model, and the group advantages behind a map."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from mrtpo import cli
from mrtpo.explaining import explain_response
from mrtpo.verifiers import Verdict, Verifier

PNG = b"\x89PNG\r\n\x1a\n"


class EvenLength(Verifier):
    name = "even_length"

    def verify(self, completion, example):
        return Verdict(
            float(len(completion) % 2 == 0), f"length {len(completion)}", ((0, len(completion)),)
        )


class HasE(Verifier):
    name = "has_e"

    def verify(self, completion, example):
        spans = tuple((m.start(), m.end()) for m in re.finditer("e", completion))
        return Verdict(float(bool(spans)), "the response must contain the letter e", spans)


ROW = {
    "prompt": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ]
}


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_explain_response_advantages_are_the_groups(tiny, beta):
    model, tokenizer = tiny
    credit_map, group = explain_response(
        model,
        tokenizer,
        [EvenLength(), HasE()],
        ROW,
        num_samples=5,
        beta=beta,
        max_new_tokens=10,
        seed=3,
    )
    assert len(group) == 6 and group[0]["explained"]
    scores = np.array(
        [[entry["scores"]["even_length"], entry["scores"]["has_e"]] for entry in group]
    )
    assert scores.std(axis=0).max() > 0, "the seeded group should disagree on some reward"
    # Ã_k of the explained response, by hand from the group's scores (TRL: Bessel std, eps 1e-4)
    expected = (scores[0] - scores.mean(axis=0)) / (scores.std(axis=0, ddof=1) + 1e-4)
    np.testing.assert_allclose(credit_map.reward_advantages, expected, atol=1e-6)
    np.testing.assert_allclose(credit_map.weights.mean(axis=1), [1.0, 1.0], atol=1e-6)
    # MRTPO re-allocates, never creates: the token mean is GDPO's advantage
    assert credit_map.token_advantages.mean() == pytest.approx(credit_map.gdpo_advantage, abs=1e-6)
    if beta == 0.0:
        np.testing.assert_allclose(
            credit_map.token_advantages, credit_map.gdpo_advantage, atol=1e-6
        )
    assert credit_map.text == group[0]["completion"]
    assert credit_map.distance.shape == (2, credit_map.num_tokens)


def test_explain_cli_writes_its_files(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "explain"
    argv = ["explain", "--task", "instructions", "--model_name_or_path", str(tiny_model_dir)]
    argv += ["--example", "2", "--max_new_tokens", "8", "--num-samples", "2"]
    argv += ["--output_dir", str(out)]
    assert cli.main(argv) == 0
    page = (out / "credit.html").read_text(encoding="utf-8")
    assert (out / "credit.png").read_bytes()[:8] == PNG
    group = json.loads((out / "group.json").read_text())
    assert [entry["explained"] for entry in group] == [True, False, False]
    # test row 2 has 6 constraints: 6 reward rows + MRTPO combined + GDPO uniform
    assert page.count('<tr class="row reward">') == 6
    assert page.count('<tr class="row combined">') == page.count('<tr class="row gdpo">') == 1
    assert "change_case:english_capital" in page
    assert "wrote" in capsys.readouterr().out


def test_explain_cli_takes_a_prompt_and_a_response_file(tiny_model_dir, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Answer <b>without</b> commas.", encoding="utf-8")
    response = tmp_path / "response.txt"
    response.write_text('Hi 😀, "you" & <script>x</script>', encoding="utf-8")
    out = tmp_path / "explain"
    argv = ["explain", "--task", "instructions", "--model_name_or_path", str(tiny_model_dir)]
    argv += ["--prompt-file", str(prompt), "--response-file", str(response), "--num-samples", "0"]
    argv += ["--example", "0", "--out", str(out)]  # the first spelling, still an alias
    assert cli.main(argv) == 0
    page = (out / "credit.html").read_text(encoding="utf-8")
    rows = page.count('<tr class="row reward">')
    assert rows == 1  # test row 0 has one constraint; no group: no combined / GDPO rows
    boxes = re.sub(r'title="[^"]*"', "", page)  # the tooltips repeat each token
    assert boxes.count("😀") == rows and "<script>" not in page
    # the page's text, tags dropped and entities decoded, holds the response as it was
    assert 'Hi 😀, "you" & <script>x</script>' in html.unescape(re.sub(r"<[^>]+>", "", boxes))
    assert "Answer &lt;b&gt;without&lt;/b&gt; commas." in page
    assert "replay distance q" in page


def test_analyze_cli_writes_its_files(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "analyze"
    argv = ["analyze", "--task", "instructions", "--model_name_or_path", str(tiny_model_dir)]
    argv += ["--n", "3", "--max_new_tokens", "8", "--output_dir", str(out)]
    assert cli.main(argv) == 0
    table = json.loads((out / "localization.json").read_text())
    assert table["responses"] == 3 and table["command"].startswith("mrtpo analyze --task")
    assert [(row["type"], row["outcome"]) for row in table["rows"][-2:]] == [
        ("all", "satisfied"),
        ("all", "violated"),
    ]
    shares = json.loads((out / "concentration.json").read_text())
    assert set(shares["all"]["top"]) == {"top 1%", "top 5%", "top 10%", "top 20%"}
    assert (out / "concentration.png").read_bytes()[:8] == PNG
    assert "| Type | Outcome |" in (out / "localization.md").read_text()
    assert len(json.loads((out / "responses.json").read_text())) == 3
    assert (out / "maps.html").read_text().count('<section class="map">') == 3
    assert "all satisfied" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["analyze", "explain"])
def test_bad_arguments_exit_2(command, capsys):
    assert cli.main([command, "--task", "instructions", "--max_new_tokens", "0"]) == 2
    assert "max_new_tokens" in capsys.readouterr().err

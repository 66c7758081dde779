"""MulDimIF's official checkers against mrtpo's, on generated responses for every test-set
constraint (a one-off run, not a test: the official code is not on PyPI).

The official scripts are imported from a copy of github.com/Junjie-Ye/MulDimIF's
`Code/evaluation` (commit efd0c02); they need `zhconv` (give the folder it is installed in)
and NLTK's punkt (the data `make install` extracts is used).

    git -C <clone> archive efd0c02 Code | tar -x -C /tmp/muldimif_official
    pip install --target /tmp/zhconv_pkg zhconv
    MULDIMIF_CODE=/tmp/muldimif_official/Code/evaluation ZHCONV=/tmp/zhconv_pkg \
        python benchmarks/results/muldimif/agreement.py TEST_JSON [ANSWERS_JSONL ...]
"""

import collections
import contextlib
import io
import json
import os
import random
import re
import sys

sys.path.insert(0, os.environ.get("ZHCONV", "/tmp/zhconv_pkg"))
sys.path.insert(0, os.environ.get("MULDIMIF_CODE", "/tmp/muldimif_official/Code/evaluation"))
import nltk

from mrtpo.tasks.instructions.muldimif_checkers import FAMILIES, parse_constraint
from mrtpo.tasks.instructions.text import NLTK_DIR, sentence_tokenizer

sentence_tokenizer()
nltk.data.path.insert(0, str(NLTK_DIR))
with contextlib.redirect_stdout(io.StringIO()):
    import scripts as official  # noqa: E402  (the official package, found on sys.path above)

CLASSES = {
    "keywords": official.Content_Keywords(),
    "words": official.Length_Words(),
    "sentences": official.Length_Sentences(),
    "paragraphs": official.Length_Paragraphs(),
    "punctuation": official.Content_Punctuation(),
    "english": official.Language_English(),
    "markdown": official.Format_Markdown(),
    "table": official.Format_Table(),
    "json": official.Format_Json(),
    "others_format": official.Format_Others(),
    "others_content": official.Content_Others(),
    "chinese": official.Language_Chinese(),
}

test = json.load(open(sys.argv[1]))
answers = []
for path in sys.argv[2:]:
    answers += [json.loads(line)["response"] for line in open(path)]
rng = random.Random(0)
WORDS = "alpha beta gamma delta the of and Strategy Rome data policy model River".split()


def words(n, case=None):
    ws = [rng.choice(WORDS) for _ in range(n)]
    if case == "upper":
        ws = [w.upper() for w in ws]
    if case == "title":
        ws = [w.capitalize() for w in ws]
    return " ".join(ws)


def table(
    rows, cols, header=("Name", "Description", "Year", "Title", "Author"), sep=True, cell=None
):
    hs = [header[i % len(header)] + ("" if i < len(header) else str(i)) for i in range(cols)]
    lines = ["| " + " | ".join(hs) + " |"]
    if sep:
        lines.append("|" + "|".join("---" for _ in hs) + "|")
    for _r in range(rows):
        lines.append(
            "| " + " | ".join(cell or words(rng.randint(1, 4), "title") + "." for _ in hs) + " |"
        )
    return "\n".join(lines)


def nested(depth):
    value = "x"
    for _ in range(depth):
        value = {"k": value}
    return value


GENERIC = [
    "",
    "   ",
    "Hello.",
    "hello world",
    "HELLO WORLD.",
    "Hello World Again.",
    "Yes? No! Maybe.",
    words(40) + ".",
    words(120, "title") + ".",
    words(160) + ".",
    words(320) + ".",
    "First paragraph here.\n\nSecond one.\n\nThird one.",
    "# Title\n\n## Section\n\nText.\n\n### Sub\n\nMore.",
    "## Only Level Two\nText",
    "# A\n## B\n### C\n#### D",
    "> quoted line\n> another",
    "> quote\nplain",
    "- item one.\n- item two!\n- item three?",
    "1. First item.\n2. Second item.\n3. Third.",
    table(3, 3),
    table(5, 2),
    table(10, 4),
    table(2, 5, sep=False),
    "Intro text:\n\n" + table(4, 3) + "\n\nOutro.",
    json.dumps(nested(1)),
    json.dumps(nested(2)),
    json.dumps(nested(3)),
    json.dumps(nested(4)),
    "```json\n" + json.dumps(nested(2), indent=2) + "\n```",
    '{"a": [1, {"b": 2}]}',
    "{not json",
    '<root a="1" b="2"><item x="1" y="2" z="3" w="4" v="5"/></root>',
    '<a x="1"/>',
    '```xml\n<a p="1" q="2" r="3"/>\n```',
    "这是简体中文的回答。",
    "這是繁體中文的回答。",
    "中文 and English mixed 文字",
    "Example: one\nExample: two",
    "List of Models: A, B.",
    "Sources: [1] Smith (Smith, 2020).",
    "Text with **bold** and - bullet",
    "ALL CAPS ANSWER WITH 5 WORDS",
    "all lower case answer here",
    "Mixed Case answer Here.",
    "End;",
    "End.~",
    "The Answer Is Short!",
    "sentence one. sentence two. sentence three. sentence four. sentence five.",
]


def derived(words_text):
    out = []
    quoted = re.findall(r"[\"'“「]([^\"'”」]+)[\"'”」]", words_text)
    for q in quoted[:4]:
        out += [
            q,
            f"This text has {q} once.",
            f"{q} {q} {q}. And {q.upper()} too.",
            f"- {q} here\n- none here",
            f"- {q} here\n- {q} there",
        ]
        out.append(table(3, 2, cell=f"{q.capitalize()} cell."))
    if quoted:
        q = quoted[0]
        out += [
            f"1. {q} first.\n2. {q} second.",
            f"1. {q} first.\n2. second.",
            f"* {q} a\n* {q.upper()} b",
            f"# {q}\n\n## {q} again\n\nText {q}.",
            f"{q}\n---\n{q} two\n---\nthree",
            json.dumps({"a": q, "b": q}),
            json.dumps([q, "x"]),
            f"中文 {q} 文字。",
            q.upper() + " " + words(10, "upper"),
            "| Name | Keyword |\n|---|---|\n"
            + "\n".join(f"| Row {i} | {q if i % 2 else q.title()} text |" for i in range(3)),
            f"# {q.title()}\n> {q}\n> more",
            f"The {q}. The {q}! The {q}?",
        ]
        out.append(" ".join(quoted) + ".")
        out.append(" ".join(q.title() for q in quoted) + " " + words(30, "title") + ".")
    for n in {int(m) for m in re.findall(r"\b(\d{1,3})\b", words_text)} | {2, 3, 5}:
        for k in (n - 1, n, n + 1):
            if k < 0 or k > 400:
                continue
            out += [
                words(k) + ".",
                words(k, "title"),
                " ".join("Sentence here." for _ in range(k)),
                "\n\n".join("Para." for _ in range(k)),
                "# H\n" + "\n".join(f"- Point {i}." for i in range(k)),
            ]
            if k <= 30:
                out += [
                    table(k, 3),
                    table(3, k) if k else "",
                    table(k, k) if k else "",
                    json.dumps(nested(k)) if k < 8 else "",
                ]
    return out


agree = collections.Counter()
total = collections.Counter()
examples = collections.defaultdict(list)
crash = collections.Counter()
passes = collections.Counter()
pairs = [(c, s, w) for row in test for c, s, w in row["constraints"]]
constant = collections.Counter()
constant_examples = {}
for category, subtype, text in pairs:
    seen = set()
    family = FAMILIES[(category, subtype)]
    rule = parse_constraint(category, subtype, text)
    picked = rng.sample(answers, min(len(answers), 25))
    # the answers as written, and variants near the limits the checkers read (case, ending)
    variants = [v for a in picked[:10] for v in (a.upper(), a.title(), a.rstrip() + ".", a[:-1])]
    responses = GENERIC + derived(text) + picked + variants
    for response in responses:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                theirs = bool(CLASSES[family].check(text, response))
        except Exception:
            crash[(category, subtype)] += 1
            continue
        ours = rule.check(response).passed
        seen.add(ours)
        total[(category, subtype)] += 1
        passes[(category, subtype)] += theirs
        if theirs == ours:
            agree[(category, subtype)] += 1
        elif len(examples[(category, subtype)]) < 4:
            examples[(category, subtype)].append((text, response[:200], theirs, ours))
    if len(seen) == 1:
        key = (category, subtype, "always passes" if seen.pop() else "always fails")
        constant[key] += 1
        constant_examples.setdefault(key, text)
print(
    f"all: {sum(agree.values())}/{sum(total.values())} agree; {sum(crash.values())} official crashes (not counted)"
)
for key in sorted(total):
    print(
        f"{key[0]}/{key[1]}: {agree[key]}/{total[key]} (official passes {passes[key]})"
        + (f" crash {crash[key]}" if crash[key] else "")
    )
for key, items in examples.items():
    for item in items:
        print("DIFF", key, repr(item[0]), repr(item[1]), "official", item[2], "ours", item[3])

print("constant verdicts:", sum(constant.values()))
for key, n in constant.most_common():
    print("CONST", key, n, repr(constant_examples[key]))

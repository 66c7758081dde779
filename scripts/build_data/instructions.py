"""Build the bundled instruction-following prompts: `python scripts/build_data/instructions.py`.

Each prompt is a short writing task plus 1 to 6 IFEval constraints that can all hold at once:
pairs that contradict each other are listed in `CONFLICTS` (e.g. all-lowercase vs a capital
word count, JSON output vs bullets or a title, a non-English language vs English keywords,
repeating the prompt vs almost anything), and `arguments_conflict` rejects pairs whose
arguments clash (at most 40 words but at least 6 sentences; fewer than 3 "z" while a keyword
holds a "z"; a forbidden word inside a required phrase). Everything is drawn from one seeded
`random.Random`, so the output is byte-for-byte reproducible.

Files (IFEval's layout, read by `load_ifeval`): `train.jsonl` and `test.jsonl` in
src/mrtpo/data/instructions (or `--out DIR`); every fifth prompt goes to the test split.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mrtpo.tasks.instructions.checkers import CONSTRAINED_RESPONSE_OPTIONS
from mrtpo.tasks.instructions.registry import build_constraint

OUT_DIR = Path(__file__).resolve().parents[2] / "src" / "mrtpo" / "data" / "instructions"
N_PROMPTS = 400
SEED = 0
TEST_EVERY = 5  # prompt i goes to the test split when i % TEST_EVERY == TEST_EVERY - 1
# How many constraints a prompt gets: 1..6 with these weights.
N_CONSTRAINTS_WEIGHTS = (20, 22, 20, 16, 12, 10)

TOPICS = [
    "a short poem about the sea",
    "a product description for a reusable water bottle",
    "a letter to a friend about a recent trip",
    "a story about a robot who learns to paint",
    "a review of a small neighborhood bakery",
    "an email asking a manager for a day off",
    "a blog post about learning to ride a bicycle",
    "a short speech for a school graduation",
    "a recipe for a simple tomato soup",
    "a summary of how rain forms",
    "a cover letter for a library assistant job",
    "an advertisement for a new board game",
    "a diary entry about a snowy morning",
    "a guide to keeping houseplants alive",
    "a fairy tale about a clever fox",
    "a note thanking a neighbor for help",
    "a description of a busy train station",
    "an explanation of why the sky is blue",
    "a pitch for a mobile app that tracks habits",
    "a short biography of an imaginary inventor",
    "a limerick about a sleepy cat",
    "a travel itinerary for one day in a mountain town",
    "a complaint to a company about a late delivery",
    "an essay on the value of public parks",
    "a welcome message for new members of a chess club",
    "a song about the first day of spring",
    "a set of tips for studying for an exam",
    "an invitation to a birthday picnic",
    "a news report about a local science fair",
    "a dialogue between a teacher and a student",
    "a description of your ideal weekend",
    "a review of a movie about space travel",
    "a story about a lost umbrella",
    "an explanation of how a bicycle works",
    "a plan for a community garden",
    "a riddle about time",
    "a motivational message for a sports team",
    "a short history of the printing press",
    "a guide to making a paper airplane",
    "a job posting for a dog walker",
    "a story set in a lighthouse",
    "a letter to your future self",
    "a description of a thunderstorm",
    "an apology for missing a meeting",
    "a proposal to add more bike lanes",
    "a poem about an old oak tree",
    "an explanation of recycling for children",
    "a profile of a fictional chef",
    "a post announcing a library book sale",
    "a story about two friends building a raft",
    "a short guide to saving money",
    "a description of a night market",
    "a thank you note to a teacher",
    "a tale about a dragon who is afraid of heights",
    "an overview of how bees make honey",
    "a message inviting people to a beach cleanup",
    "a description of a quiet village",
    "a story about a musician on a rainy day",
    "an explanation of what a volcano is",
    "a packing list for a camping trip",
]
KEYWORDS = [
    "river", "lantern", "harvest", "journey", "window", "silver", "garden", "promise",
    "thunder", "compass", "meadow", "bridge", "candle", "echo", "orbit", "velvet",
]  # fmt: skip
FREQUENCY_KEYWORDS = ["light", "home", "friend", "water", "time", "dream", "road", "music"]
FORBIDDEN_WORDS = ["very", "really", "thing", "stuff", "nice", "just", "actually", "basically"]
FIRST_WORDS = ["today", "finally", "first", "next", "imagine", "meanwhile", "however", "overall"]
END_PHRASES = [
    "Any other questions?",
    "Is there anything else I can help with?",
    "Let me know if you have additional questions.",
    "That is all for now.",
]
LANGUAGES = ["es", "fr", "de", "it", "pt"]
REPEAT_INSTRUCTION = (
    "First repeat the request word for word without change, then give your answer "
    "(1. do not say any words or characters before repeating the request; "
    "2. the request you need to repeat does not include this sentence)"
)


def _relation(rng: random.Random) -> str:
    return rng.choice(["less than", "at least"])


def _keyword_frequency(rng: random.Random) -> dict[str, Any]:
    return {
        "keyword": rng.choice(FREQUENCY_KEYWORDS),
        "frequency": rng.randint(2, 3),
        "relation": _relation(rng),
    }


def _letter_frequency(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {
            "letter": rng.choice("aeinorst"),
            "let_frequency": rng.randint(5, 15),
            "let_relation": "at least",
        }
    return {
        "letter": rng.choice("qzxj"),
        "let_frequency": rng.randint(2, 4),
        "let_relation": "less than",
    }


def _number_sentences(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"num_sentences": rng.randint(3, 8), "relation": "less than"}
    return {"num_sentences": rng.randint(2, 6), "relation": "at least"}


def _number_words(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"num_words": rng.randrange(40, 160, 10), "relation": "less than"}
    return {"num_words": rng.randrange(30, 130, 10), "relation": "at least"}


def _nth_paragraph(rng: random.Random) -> dict[str, Any]:
    num = rng.randint(2, 4)
    return {
        "num_paragraphs": num,
        "nth_paragraph": rng.randint(1, num),
        "first_word": rng.choice(FIRST_WORDS),
    }


def _capital_frequency(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"capital_frequency": rng.randint(2, 5), "capital_relation": "at least"}
    return {"capital_frequency": rng.randint(3, 6), "capital_relation": "less than"}


# How to draw each instruction's kwargs (prompt_to_repeat is filled in once the prompt is known).
SAMPLERS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "keywords:existence": lambda rng: {"keywords": rng.sample(KEYWORDS, rng.randint(1, 2))},
    "keywords:frequency": _keyword_frequency,
    "keywords:forbidden_words": lambda rng: {
        "forbidden_words": rng.sample(FORBIDDEN_WORDS, rng.randint(1, 3))
    },
    "keywords:letter_frequency": _letter_frequency,
    "language:response_language": lambda rng: {"language": rng.choice(LANGUAGES)},
    "length_constraints:number_sentences": _number_sentences,
    "length_constraints:number_paragraphs": lambda rng: {"num_paragraphs": rng.randint(2, 4)},
    "length_constraints:number_words": _number_words,
    "length_constraints:nth_paragraph_first_word": _nth_paragraph,
    "detectable_content:number_placeholders": lambda rng: {"num_placeholders": rng.randint(1, 4)},
    "detectable_content:postscript": lambda rng: {
        "postscript_marker": rng.choice(["P.S.", "P.P.S"])
    },
    "detectable_format:number_bullet_lists": lambda rng: {"num_bullets": rng.randint(2, 5)},
    "detectable_format:constrained_response": lambda rng: {},
    "detectable_format:number_highlighted_sections": lambda rng: {
        "num_highlights": rng.randint(1, 3)
    },
    "detectable_format:multiple_sections": lambda rng: {
        "section_spliter": rng.choice(["Section", "SECTION"]),
        "num_sections": rng.randint(2, 4),
    },
    "detectable_format:json_format": lambda rng: {},
    "detectable_format:title": lambda rng: {},
    "combination:two_responses": lambda rng: {},
    "combination:repeat_prompt": lambda rng: {},
    "startend:end_checker": lambda rng: {"end_phrase": rng.choice(END_PHRASES)},
    "change_case:capital_word_frequency": _capital_frequency,
    "change_case:english_capital": lambda rng: {},
    "change_case:english_lowercase": lambda rng: {},
    "punctuation:no_comma": lambda rng: {},
    "startend:quotation": lambda rng: {},
}

# Instructions that cannot (or can barely) hold together; made symmetric below.
_CONFLICT_LIST: dict[str, set[str]] = {
    "language:response_language": {
        "keywords:existence", "keywords:frequency", "keywords:letter_frequency",
        "change_case:english_capital", "change_case:english_lowercase",
        "change_case:capital_word_frequency", "detectable_format:constrained_response",
        "startend:end_checker", "length_constraints:nth_paragraph_first_word",
        "detectable_format:json_format", "combination:two_responses",
    },
    "change_case:english_capital": {
        "change_case:english_lowercase", "change_case:capital_word_frequency",
        "detectable_format:constrained_response", "startend:end_checker",
        "detectable_format:multiple_sections", "detectable_format:json_format",
    },
    "change_case:english_lowercase": {
        "change_case:capital_word_frequency", "detectable_format:constrained_response",
        "startend:end_checker", "detectable_format:multiple_sections",
    },
    "detectable_format:json_format": {
        "detectable_format:number_bullet_lists", "detectable_format:title",
        "detectable_format:multiple_sections", "length_constraints:number_paragraphs",
        "length_constraints:nth_paragraph_first_word", "detectable_content:postscript",
        "combination:two_responses", "startend:end_checker", "startend:quotation",
        "detectable_format:constrained_response", "detectable_format:number_highlighted_sections",
        "punctuation:no_comma",
    },
    "combination:two_responses": {
        "length_constraints:number_paragraphs", "length_constraints:nth_paragraph_first_word",
        "startend:quotation", "detectable_format:constrained_response", "startend:end_checker",
        "detectable_content:postscript",
    },
    "startend:end_checker": {"detectable_content:postscript", "detectable_format:constrained_response"},
    "length_constraints:number_paragraphs": {"length_constraints:nth_paragraph_first_word"},
    "length_constraints:nth_paragraph_first_word": {"detectable_format:title", "detectable_format:multiple_sections"},
}  # fmt: skip
# These two go with only a few others: a one-line verdict; repeating the request verbatim.
_ONLY_WITH = {
    "detectable_format:constrained_response": {
        "punctuation:no_comma", "startend:quotation", "keywords:forbidden_words",
    },
    "combination:repeat_prompt": {
        "keywords:existence", "detectable_format:title", "detectable_content:postscript",
        "startend:end_checker", "detectable_format:number_highlighted_sections",
        "detectable_content:number_placeholders",
    },
}  # fmt: skip


def _symmetric_conflicts() -> dict[str, set[str]]:
    conflicts = {instruction_id: set() for instruction_id in SAMPLERS}
    for a, others in _CONFLICT_LIST.items():
        for b in others:
            conflicts[a].add(b)
            conflicts[b].add(a)
    for a, allowed in _ONLY_WITH.items():
        for b in SAMPLERS:
            if b != a and b not in allowed:
                conflicts[a].add(b)
                conflicts[b].add(a)
    return conflicts


CONFLICTS = _symmetric_conflicts()
# Instructions whose kwargs count visible parts (each takes a sentence and some words).
_PART_COUNTS = {
    "length_constraints:number_paragraphs": "num_paragraphs",
    "length_constraints:nth_paragraph_first_word": "num_paragraphs",
    "detectable_format:number_bullet_lists": "num_bullets",
    "detectable_format:multiple_sections": "num_sections",
    "detectable_format:number_highlighted_sections": "num_highlights",
    "detectable_content:number_placeholders": "num_placeholders",
}


def required_phrases(instruction_id: str, kwargs: dict[str, Any]) -> list[str]:
    """Text a response must contain to follow this instruction."""
    if instruction_id == "keywords:existence":
        return list(kwargs["keywords"])
    if instruction_id == "keywords:frequency" and kwargs["relation"] == "at least":
        return [kwargs["keyword"]]
    if instruction_id == "length_constraints:nth_paragraph_first_word":
        return [kwargs["first_word"]]
    if instruction_id == "startend:end_checker":
        return [kwargs["end_phrase"]]
    if instruction_id == "detectable_content:postscript":
        return [kwargs["postscript_marker"]]
    if instruction_id == "detectable_format:multiple_sections":
        return [kwargs["section_spliter"]]
    if instruction_id == "detectable_format:constrained_response":
        return list(CONSTRAINED_RESPONSE_OPTIONS)
    return []


def arguments_conflict(a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]]) -> bool:
    """Whether two instructions' arguments clash (checked both ways round)."""
    return _one_way_conflict(a, b) or _one_way_conflict(b, a)


def _one_way_conflict(a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]]) -> bool:
    (a_id, a_args), (b_id, b_args) = a, b
    if a_id == "length_constraints:number_words" and b_id == "length_constraints:number_sentences":
        words, sentences = a_args["num_words"], b_args["num_sentences"]
        if a_args["relation"] == "less than" and b_args["relation"] == "at least":
            return words < 8 * sentences  # about 8 words a sentence at the least
        if a_args["relation"] == "at least" and b_args["relation"] == "less than":
            return words > 25 * (sentences - 1)  # about 25 words a sentence at the most
    if b_id in _PART_COUNTS:
        parts = b_args[_PART_COUNTS[b_id]]
        if a_id == "length_constraints:number_words" and a_args["relation"] == "less than":
            return a_args["num_words"] < 15 * parts
        if a_id == "length_constraints:number_sentences" and a_args["relation"] == "less than":
            return a_args["num_sentences"] < parts + 2
    if a_id == "keywords:letter_frequency" and a_args["let_relation"] == "less than":
        return any(a_args["letter"] in phrase.lower() for phrase in required_phrases(b_id, b_args))
    if a_id == "keywords:forbidden_words":
        return any(
            re.search(rf"\b{word}\b", phrase, re.IGNORECASE)
            for word in a_args["forbidden_words"]
            for phrase in required_phrases(b_id, b_args)
        )
    return False


def draw_constraints(rng: random.Random, n: int) -> list[tuple[str, dict[str, Any]]]:
    """`n` instructions that do not conflict, with their kwargs (greedy over a shuffle,
    reshuffled until `n` fit)."""
    while True:
        order = sorted(SAMPLERS)
        rng.shuffle(order)
        chosen: list[tuple[str, dict[str, Any]]] = []
        for instruction_id in order:
            if any(instruction_id in CONFLICTS[other] for other, _ in chosen):
                continue
            candidate = (instruction_id, SAMPLERS[instruction_id](rng))
            if any(arguments_conflict(candidate, other) for other in chosen):
                continue
            chosen.append(candidate)
            if len(chosen) == n:
                return chosen


def make_row(key: int, topic: str, constraints: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One prompt in IFEval's layout: the task, then one sentence (or two) per constraint."""
    parts = [f"Write {topic}."]
    for instruction_id, kwargs in constraints:
        if instruction_id != "combination:repeat_prompt":
            parts.append(build_constraint(instruction_id, kwargs).statement)
    prompt = " ".join(parts)
    if any(instruction_id == "combination:repeat_prompt" for instruction_id, _ in constraints):
        for instruction_id, kwargs in constraints:
            if instruction_id == "combination:repeat_prompt":
                kwargs["prompt_to_repeat"] = prompt
        prompt = f"{prompt} {REPEAT_INSTRUCTION}"
    return {
        "key": key,
        "prompt": prompt,
        "instruction_id_list": [instruction_id for instruction_id, _ in constraints],
        "kwargs": [kwargs for _, kwargs in constraints],
    }


def build(
    n_prompts: int = N_PROMPTS, seed: int = SEED
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, test rows), deterministic in `seed`."""
    rng = random.Random(seed)
    train, test = [], []
    for index in range(n_prompts):
        n = rng.choices(range(1, len(N_CONSTRAINTS_WEIGHTS) + 1), weights=N_CONSTRAINTS_WEIGHTS)[0]
        row = make_row(index + 1, TOPICS[index % len(TOPICS)], draw_constraints(rng, n))
        (test if index % TEST_EVERY == TEST_EVERY - 1 else train).append(row)
    return train, test


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=OUT_DIR, help="folder for train.jsonl and test.jsonl"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    train, test = build()
    write_jsonl(train, args.out / "train.jsonl")
    write_jsonl(test, args.out / "test.jsonl")
    print(f"{len(train)} train and {len(test)} test prompts in {args.out}")


if __name__ == "__main__":
    main()

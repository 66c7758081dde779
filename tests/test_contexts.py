"""Replay contexts are the ids a user of the chat template gets, rendered as TRL renders them.

Checked with the embedded models' tokenizers (SmolLM2's, and Qwen2.5-Coder-0.5B-Instruct's own
tokenizer and chat template, tools included) and with a Qwen2-style byte-level BPE
(transformers' Qwen2 pipeline: NFC, Qwen2's split pattern, ByteLevel) trained here on the
bundled tasks' text; in both Qwen vocabularies merges (".\\n\\n" is one token) cross the prompt /
information boundary: each context's ids must equal the tokenizer's ids of the whole rendered
context. The replay is compared with the whole-context naive replay on tiny random models
over each vocabulary (Qwen2.5's: 151,936 tokens).
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, trainers
from tokenizers import models as bpe_models
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer
from trl import GRPOTrainer

from mrtpo import models, tasks
from mrtpo.relevance import build_contexts, context_infos, naive_replay_distances, replay_distances
from mrtpo.relevance.contexts import Contexts, common_prefix_length, share_prefixes
from mrtpo.testing import tiny_model, tiny_qwen2_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS_PER_TASK = 3
DUMMY_COMPLETION = "I do not know."

# A Qwen2.5-like ChatML template: tools listed in the system turn, content a string or a list
# of text parts, and Qwen3's `enable_thinking` switch (a chat_template_kwargs example).
QWEN_LIKE_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}{{ part['text'] }}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\n' + text(messages[0]['content']) }}"
    "{%- else -%}{{ '<|im_start|>system\nYou are a helpful assistant.' }}{%- endif -%}"
    "{%- if tools -%}"
    "{{ '\n\n# Tools\n<tools>' }}"
    "{%- for tool in tools -%}{{ '\n' + (tool | tojson) }}{%- endfor -%}"
    "{{ '\n</tools>' }}"
    "{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message['role'] == 'system') -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + text(message['content']) + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{ '<think>\n\n</think>\n\n' }}"
    "{%- endif -%}{%- endif -%}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name.
    """
    return f"sunny in {city}"


# ----------------------------------------------------------------------------- data


def _task_rows() -> list[tuple[str, list[dict], list[str], str]]:
    """(task, prompt messages, K infos, completion) for each bundled task's first rows, with
    the verifiers' information on a reference and on a dummy completion (as the trainer gets
    it from each verifier's verdict)."""
    rows = []
    for name in tasks.names():
        task = tasks.get(name)
        verifiers = task.verifiers()
        data = task.load("train")
        for example in data.select(range(ROWS_PER_TASK)):
            completions = [task.reference_completion(example), DUMMY_COMPLETION]
            for completion in [c for c in completions if c is not None]:
                infos = [verifier.verify(completion, example).info for verifier in verifiers]
                rows.append((name, example["prompt"], infos, completion))
    return rows


@pytest.fixture(scope="module")
def task_rows():
    rows = _task_rows()
    assert {name for name, *_ in rows} == set(tasks.names())
    assert all(any(infos) for *_, infos, _ in rows)
    return rows


@pytest.fixture(scope="module")
def smollm2():
    """The default embedded model's tokenizer (SmolLM2-135M-Instruct's): from the converted
    model's cache when it is there, else read from the GGUF file once and kept."""
    return models.embedded_tokenizer(models.DEFAULT_MODEL)


@pytest.fixture(scope="module")
def qwen25():
    """Qwen2.5-Coder-0.5B-Instruct's tokenizer and chat template, read from the embedded GGUF
    (extracted into the cache once, about 15 s; later under a second)."""
    tokenizer = models.embedded_tokenizer(models.QWEN25_CODER_05B.name)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer" and len(tokenizer) == 151_936
    assert tokenizer.tokenize(".\n\n") == [".ĊĊ"]
    return tokenizer


@pytest.fixture(scope="module")
def qwen_style(task_rows):
    """transformers' Qwen2 tokenizer pipeline with a 1500-token BPE trained on the tasks' text
    (prompts, informations, completions), and a Qwen-like chat template."""
    corpus = []
    for _, prompt, infos, completion in task_rows:
        corpus.extend([message["content"] for message in prompt] + infos + [completion])
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe = Tokenizer(bpe_models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    learned = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=learned["vocab"], merges=[tuple(merge) for merge in learned["merges"]]
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tokenizer.chat_template = QWEN_LIKE_TEMPLATE
    # The boundary this file is about: punctuation and the newlines after it are one token.
    assert tokenizer.tokenize(".\n\n") == [".ĊĊ"]
    return tokenizer


def with_information(messages: list[dict], pieces: list[str]) -> list[dict]:
    """The messages a user would write: the information after the last user turn's text."""
    messages = copy.deepcopy(messages)
    appended = "".join("\n\n" + piece for piece in pieces)
    last = messages[-1]
    if isinstance(last["content"], str):
        last["content"] += appended
    else:
        last["content"][-1]["text"] += appended
    return messages


def rendered_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids of the rendered chat: the template's text, tokenized without added specials."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def trl_prompt_ids(tokenizer, prompts, tools=None, chat_template=None, template_kwargs=None):
    """The prompt ids TRL 1.16's GRPOTrainer generates from (its own `_tokenize_prompts`)."""
    trainer = SimpleNamespace(
        _is_vlm=False,
        environment_factories=None,
        processing_class=tokenizer,
        tools=tools or [],
        chat_template=chat_template,
        chat_template_kwargs=template_kwargs or {},
    )
    prompt_ids, _, _ = GRPOTrainer._tokenize_prompts(trainer, prompts)
    return [list(ids) for ids in prompt_ids]


# ----------------------------------------------------------------------------- canonical ids


@pytest.mark.parametrize("tokenizer_name", ["smollm2", "qwen_style", "qwen25"])
@pytest.mark.parametrize("mode", ["leave_one_out", "add_one"])
def test_every_context_is_the_whole_rendered_context(request, task_rows, tokenizer_name, mode):
    tokenizer = request.getfixturevalue(tokenizer_name)
    for name, prompt, infos, completion in task_rows:
        contexts = build_contexts(tokenizer, prompt, infos, mode)
        expected = [
            rendered_ids(tokenizer, with_information(prompt, pieces))
            for pieces in context_infos(infos, mode)
        ]
        for context, ids in enumerate(expected):
            assert contexts.ids(context) == ids, (name, mode, context)
        # The prefix is the longest common token prefix, computed here independently.
        size = 0
        while (
            all(len(ids) > size for ids in expected) and len({ids[size] for ids in expected}) == 1
        ):
            size += 1
        assert len(contexts.prefix) == size, (name, mode)
        # The completion's ids follow the context unchanged.
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        for context, ids in enumerate(expected):
            assert contexts.sequence(context, completion_ids) == [*ids, *completion_ids]


@pytest.mark.parametrize("tokenizer_name", ["qwen_style", "qwen25"])
def test_tokenizing_apart_splits_qwen_boundaries(request, task_rows, tokenizer_name):
    """The fault the previous test guards against is present in these rows: tokenizing the
    rendered prompt and the information apart gives other ids than the whole context (the
    prompt's last punctuation and the information's first newlines are one token)."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    differ = 0
    for _, prompt, infos, _ in task_rows:
        pieces = [info for info in infos if info]
        text = tokenizer.apply_chat_template(
            with_information(prompt, pieces), add_generation_prompt=True, tokenize=False
        )
        boundary = text.index("\n\n" + pieces[0])
        apart = [
            *tokenizer(text[:boundary], add_special_tokens=False)["input_ids"],
            *tokenizer(text[boundary:], add_special_tokens=False)["input_ids"],
        ]
        whole = build_contexts(tokenizer, prompt, infos).ids(0)
        differ += apart != whole
    assert differ == len(task_rows)


@pytest.mark.parametrize("tokenizer_name", ["smollm2", "qwen_style", "qwen25"])
def test_prompts_ending_with_a_newline(request, tokenizer_name):
    """SmolLM2 merges the prompt's last newline with the information's first ones."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    infos = ["Schema: singer(name, age)", "Reference: SELECT name FROM singer"]
    messages = [{"role": "user", "content": "Which singers are older than 30?\n"}]
    contexts = build_contexts(tokenizer, messages, infos)
    for context, pieces in enumerate(context_infos(infos)):
        assert contexts.ids(context) == rendered_ids(tokenizer, with_information(messages, pieces))
    text = "Question: which singers are older than 30?\n"
    contexts = build_contexts(tokenizer, text, infos, mode="add_one")
    for context, pieces in enumerate(context_infos(infos, "add_one")):
        whole = text + "".join("\n\n" + piece for piece in pieces)
        assert contexts.ids(context) == trl_prompt_ids(tokenizer, [whole])[0]


def test_contexts_split_cut_and_share_prefixes():
    contexts = Contexts.split([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]])
    assert contexts == Contexts((1, 2), ((3, 4), (5,), (3,)))
    assert Contexts.split([[7, 8], [7, 8]]) == Contexts((7, 8), ((), ()))
    assert Contexts.split([[1, 2], [3, 2]]) == Contexts((), ((1, 2), (3, 2)))
    assert common_prefix_length([[1, 2, 3]]) == 3
    assert contexts.cut(1) == Contexts((1,), ((2, 3, 4), (2, 5), (2, 3)))
    with pytest.raises(ValueError, match="size"):
        contexts.cut(3)
    other = Contexts.split([[1, 2, 3, 9], [1, 2, 3, 8]])  # same prompt, a longer prefix
    third = Contexts.split([[1, 6, 7], [1, 6, 8]])  # another prompt
    shared = share_prefixes([contexts, other, third], ["a", "a", "b"])
    assert [ctx.prefix for ctx in shared] == [(1, 2), (1, 2), (1, 6)]
    for before, after in zip([contexts, other, third], shared, strict=True):
        assert [before.ids(c) for c in range(2)] == [after.ids(c) for c in range(2)]


# ----------------------------------------------------------------------------- the replay


@pytest.fixture(scope="module")
def qwen_model(qwen_style):
    """A tiny Llama over the Qwen-style vocabulary, with large weights (peaked outputs)."""
    model = tiny_model(len(qwen_style), seed=3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def qwen25_model():
    """A tiny random Qwen2 over Qwen2.5's whole vocabulary (151,936), with peaked outputs."""
    model = tiny_qwen2_model(151_936, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


# (tokenizer fixture, model fixture, the chat template the tool tests render with: the
# Qwen-like one for the trained BPE, the tokenizer's own (None) for Qwen2.5's).
QWEN_SETUPS = {
    "qwen_style": ("qwen_style", "qwen_model", QWEN_LIKE_TEMPLATE),
    "qwen25": ("qwen25", "qwen25_model", None),
}


@pytest.fixture(params=list(QWEN_SETUPS))
def qwen_setup(request):
    """(tokenizer, model, template) of the trained Qwen-style BPE and of Qwen2.5's own."""
    tokenizer_name, model_name, template = QWEN_SETUPS[request.param]
    return (
        request.getfixturevalue(tokenizer_name),
        request.getfixturevalue(model_name),
        template,
    )


def _count_prefix_passes(model):
    passes = []

    def record(_module, args, kwargs):
        if kwargs.get("attention_mask") is None:  # the prefix pass runs without a mask
            passes.append(kwargs.get("input_ids", args[0] if args else None).shape)

    return passes, model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)


@pytest.mark.parametrize("mode", ["leave_one_out", "add_one"])
def test_replay_equals_naive_with_canonical_contexts(qwen_setup, task_rows, mode):
    """Rows of the bundled tasks (instructions: short prompts), G = 2 per prompt."""
    qwen_style, qwen_model, _ = qwen_setup
    rows = [row for row in task_rows if row[0] == "instructions"][:4]
    prompts = [prompt for _, prompt, _, _ in rows]
    infos = [row_infos for _, _, row_infos, _ in rows]
    completions = [
        qwen_style(completion, add_special_tokens=False)["input_ids"][:24] + [2]
        for *_, completion in rows
    ]
    naive, naive_mask = naive_replay_distances(
        qwen_model, qwen_style, prompts, completions, infos, mode=mode
    )
    assert naive.max() > 0.05
    for share in (True, False):
        distance, mask = replay_distances(
            qwen_model,
            qwen_style,
            prompts,
            completions,
            infos,
            mode=mode,
            batch_size=4,
            chunk_size=16,
            share_information=share,
        )
        assert torch.equal(mask, naive_mask)
        torch.testing.assert_close(distance, naive, atol=1e-5, rtol=0)


def test_one_prefix_pass_per_prompt_and_an_empty_prefix(qwen_setup):
    """Rows of one prompt whose own common prefixes differ (row 0's informations all start
    with "Verdict:") share one prefix pass; a prompt whose contexts differ from their first
    token on (".", then ".\\n\\n...") has an empty prefix and is replayed all the same."""
    qwen_style, qwen_model, _ = qwen_setup
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    prompts = [messages, messages, "."]
    infos = [
        ["Verdict: the poem rhymes.", "Verdict: no title."],
        ["Format: a poem.", "Verdict: no title."],
        ["Constraint: at least 3 lines.", ""],
    ]
    contexts = [build_contexts(qwen_style, p, i) for p, i in zip(prompts, infos, strict=True)]
    assert len(contexts[0].prefix) > len(contexts[1].prefix) and contexts[2].prefix == ()
    completions = [[300, 301, 302, 2], [303, 304, 2], [305, 306, 307]]
    passes, handle = _count_prefix_passes(qwen_model)
    try:
        distance, _ = replay_distances(qwen_model, qwen_style, prompts, completions, infos)
    finally:
        handle.remove()
    assert len(passes) == 1  # the chat prompt's; the empty prefix caches nothing
    naive, _ = naive_replay_distances(qwen_model, qwen_style, prompts, completions, infos)
    torch.testing.assert_close(distance, naive, atol=1e-5, rtol=0)
    assert distance[2, 0, :3].min() > 0


# ----------------------------------------------------------------------------- as TRL renders


SYSTEM_TURN = {"role": "system", "content": "You answer weather questions."}
USER_TURN = {"role": "user", "content": "What is the weather in Paris today?"}
WEATHER_INFOS = ["Format: one tool call.", "Reference call: get_weather(city='Paris')."]


def test_tools_chat_template_and_kwargs_render_as_trl_does(qwen_setup):
    qwen_style, _, own_template = qwen_setup
    own_template = own_template or qwen_style.chat_template
    messages = [SYSTEM_TURN, USER_TURN]
    other_template = QWEN_LIKE_TEMPLATE.replace("# Tools", "# Functions")
    for tools, template, kwargs in [
        ([get_weather], None, None),
        ([get_weather], other_template, {"enable_thinking": False}),
        ([], other_template, None),  # no tools: rendered as None, as TRL does
        (None, None, {"enable_thinking": False}),
    ]:
        contexts = build_contexts(
            qwen_style,
            messages,
            WEATHER_INFOS,
            "leave_one_out",
            kwargs,
            tools=tools,
            chat_template=template,
        )
        expected = trl_prompt_ids(
            qwen_style,
            [with_information(messages, pieces) for pieces in context_infos(WEATHER_INFOS)],
            tools,
            template,
            kwargs,
        )
        assert [contexts.ids(c) for c in range(3)] == expected
    with_tools = build_contexts(qwen_style, messages, WEATHER_INFOS, tools=[get_weather])
    assert "get_weather" in qwen_style.decode(with_tools.prefix)
    # Without a system turn, with and without tools (Qwen2.5's template writes its own).
    for tools in (None, [get_weather]):
        contexts = build_contexts(qwen_style, [USER_TURN], WEATHER_INFOS, tools=tools)
        expected = trl_prompt_ids(
            qwen_style,
            [with_information([USER_TURN], pieces) for pieces in context_infos(WEATHER_INFOS)],
            tools,
        )
        assert [contexts.ids(c) for c in range(3)] == expected
    # A tokenizer without a template of its own, given one.
    bare = copy.deepcopy(qwen_style)
    bare.chat_template = None
    given = build_contexts(bare, messages, WEATHER_INFOS, chat_template=own_template)
    assert given == build_contexts(qwen_style, messages, WEATHER_INFOS)
    with pytest.raises(ValueError, match="no chat template"):
        build_contexts(bare, messages, WEATHER_INFOS)


def test_replay_renders_with_tools(qwen_setup):
    qwen_style, qwen_model, template = qwen_setup
    prompts = [[SYSTEM_TURN, USER_TURN]] * 2
    completions = [[400, 401, 402, 2], [403, 404, 2]]
    infos = [WEATHER_INFOS, [WEATHER_INFOS[0], ""]]
    options = {"tools": [get_weather], "chat_template": template}
    distance, _ = replay_distances(qwen_model, qwen_style, prompts, completions, infos, **options)
    naive, _ = naive_replay_distances(
        qwen_model, qwen_style, prompts, completions, infos, **options
    )
    torch.testing.assert_close(distance, naive, atol=1e-5, rtol=0)
    without, _ = replay_distances(qwen_model, qwen_style, prompts, completions, infos)
    assert (distance - without).abs().max() > 1e-4  # the tools are in the replayed context


def test_text_parts_are_supported_and_other_parts_refused(qwen_style):
    parts = [
        {"type": "text", "text": "What is the weather "},
        {"type": "text", "text": "in Paris today?"},
    ]
    messages = [SYSTEM_TURN, {"role": "user", "content": parts}]
    contexts = build_contexts(qwen_style, messages, WEATHER_INFOS)
    expected = trl_prompt_ids(
        qwen_style, [with_information(messages, p) for p in context_infos(WEATHER_INFOS)]
    )
    assert [contexts.ids(c) for c in range(3)] == expected
    # This template joins the parts: the same ids as the string content.
    assert contexts == build_contexts(qwen_style, [SYSTEM_TURN, USER_TURN], WEATHER_INFOS)
    assert messages[1]["content"] == parts  # the caller's prompt is left as it was
    image = [{"type": "image", "image": "paris.png"}, *parts]
    with pytest.raises(ValueError, match=r"prompts\[0\].*non-text.*gdpo"):
        build_contexts(qwen_style, [SYSTEM_TURN, {"role": "user", "content": image}], ["a"])
    with pytest.raises(ValueError, match="non-empty list of text parts"):
        build_contexts(qwen_style, [SYSTEM_TURN, {"role": "user", "content": []}], ["a"])

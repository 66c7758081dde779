"""The K + 1 replay contexts of a row, as token ids, built from its prompt and K informations.

For every response, the *same generated token ids* are teacher-forced after K + 1 contexts
(``docs/METHOD.md``, MRTPO, step 1): ``leave_one_out`` compares the prompt plus all K
verifiers' information (``full``) with the prompt plus all but reward k's (``minus_k``);
``add_one`` compares the bare prompt with the prompt plus reward k's information only.

The information goes after the original prompt (appended to the last user turn of chat
messages). Each context is then rendered and tokenized whole, exactly as TRL's GRPOTrainer
renders and tokenizes a prompt, so its ids are those a user of the template gets for that
text: tokenizing the prompt and the information apart would split tokens that byte-level BPEs
merge across the boundary (".\\n\\n" is one token for Qwen2's tokenizers). The contexts' shared
prefix is their longest common token prefix, computed from the ids. Also here: the checks of
the replay's inputs (prompts, completion ids, informations), which the replay and its naive
reference share.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

MODES = ("leave_one_out", "add_one")
INFO_SEPARATOR = "\n\n"  # between the original user content and each piece of information


@dataclass(frozen=True)
class Contexts:
    """The K + 1 replay contexts of one row, as token ids.

    Context c is ``prefix + suffixes[c]`` (c = 0: the reference, ``full`` or the bare prompt;
    c = k >= 1: ``minus_k`` or ``plus_k``); the completion ids follow unchanged. ``prefix`` is
    a common token prefix of all K + 1 contexts (run once and shared by the replay).
    """

    prefix: tuple[int, ...]
    suffixes: tuple[tuple[int, ...], ...]

    @classmethod
    def split(cls, contexts: Sequence[Sequence[int]]) -> Contexts:
        """The contexts with these whole ids, split after their longest common prefix."""
        size = common_prefix_length(contexts)
        return cls(tuple(contexts[0][:size]), tuple(tuple(ids[size:]) for ids in contexts))

    def cut(self, size: int) -> Contexts:
        """The same contexts with only the first ``size`` ids of the prefix as their prefix."""
        if not 0 <= size <= len(self.prefix):
            raise ValueError(f"size must be in [0, {len(self.prefix)}], got {size}")
        kept = self.prefix[size:]
        return Contexts(self.prefix[:size], tuple(kept + suffix for suffix in self.suffixes))

    def ids(self, context: int) -> list[int]:
        return [*self.prefix, *self.suffixes[context]]

    def sequence(self, context: int, completion: Sequence[int]) -> list[int]:
        """The ids teacher-forced for context ``context``: context ids then the completion."""
        return [*self.prefix, *self.suffixes[context], *completion]


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """The length of the longest prefix that all ``sequences`` (at least one) share."""
    first = sequences[0]
    size = min(len(ids) for ids in sequences)
    for ids in sequences[1:]:
        shared = 0
        while shared < size and ids[shared] == first[shared]:
            shared += 1
        size = shared
    return size


def context_infos(infos: Sequence[str], mode: str = "leave_one_out") -> list[list[str]]:
    """Which pieces of information each of the K + 1 contexts appends (empty ones dropped)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    kept = list(infos)
    if mode == "leave_one_out":
        full = [info for info in kept if info]
        minus = [[info for j, info in enumerate(kept) if j != k and info] for k in range(len(kept))]
        return [full, *minus]
    return [[], *[[info] if info else [] for info in kept]]


def _appended_text(pieces: Sequence[str]) -> str:
    """The text added after the original content: nothing when there is no information."""
    return "".join(INFO_SEPARATOR + piece for piece in pieces)


def _last_user(messages: Sequence[Mapping[str, Any]]) -> int:
    return max(i for i, message in enumerate(messages) if message.get("role") == "user")


def _with_information(messages: Sequence[Mapping[str, Any]], appended: str) -> list[dict[str, Any]]:
    """The messages with ``appended`` added to the end of the last user turn's text (a string,
    or the last text part of a list of content parts)."""
    messages = [dict(message) for message in messages]
    last_user = _last_user(messages)
    content = messages[last_user]["content"]
    if isinstance(content, str):
        messages[last_user]["content"] = content + appended
    else:
        parts = [dict(part) for part in content]
        parts[-1]["text"] = parts[-1]["text"] + appended
        messages[last_user]["content"] = parts
    return messages


def _text_parts_only(content: Any) -> bool:
    return all(
        isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
        for part in content
    )


def _check_messages(prompt: Sequence[Any], row: int, tokenizer: Any, chat_template: Any) -> None:
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"prompts[{row}] is a list of chat messages but the tokenizer has no chat template "
            "(and no chat_template was given)"
        )
    if not all(isinstance(message, Mapping) for message in prompt):
        raise ValueError(f"prompts[{row}] must be a string or a list of chat-message dicts")
    for message in prompt:
        content = message.get("content")
        # The replay runs token ids only: an image, audio or video part would have no pixel
        # values or features behind its placeholder tokens, so the replay would be wrong.
        if isinstance(content, list) and not _text_parts_only(content):
            raise ValueError(
                f"prompts[{row}] has a {message.get('role')!r} message with a non-text content "
                "part; the replay feeds token ids only, so multimodal prompts cannot be replayed: "
                "use text prompts (a string or text parts {'type': 'text', 'text': ...}) or "
                "advantage_estimator='gdpo'"
            )
    users = [m for m in prompt if m.get("role") == "user"]
    if not users:
        raise ValueError(f"prompts[{row}] has no user message to append verifier information to")
    content = users[-1].get("content")
    if not (isinstance(content, str) or (isinstance(content, list) and content)):
        raise ValueError(
            f"prompts[{row}]: the last user message's content must be a string or a non-empty "
            "list of text parts"
        )


def check_prompt(prompt: Any, row: int, tokenizer: Any, chat_template: str | None = None) -> None:
    """Raise ValueError (naming ``prompts[row]`` and what to use instead) unless the replay can
    append verifier information to ``prompt``: a non-empty string, or chat messages with a user
    turn, text content only, and a chat template to render them.

    The trainer calls it on every row before generation, so a prompt the replay cannot serve is
    refused at once on every process, not when the row is first replayed.
    """
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"prompts[{row}] is empty: there is no context to replay after")
    elif isinstance(prompt, Sequence):
        _check_messages(prompt, row, tokenizer, chat_template)
    else:
        raise ValueError(
            f"prompts[{row}] must be a string or a list of chat-message dicts, got "
            f"{type(prompt).__name__}"
        )


def build_contexts(
    tokenizer: Any,
    prompt: str | Sequence[Mapping[str, Any]],
    infos: Sequence[str],
    mode: str = "leave_one_out",
    chat_template_kwargs: Mapping[str, Any] | None = None,
    row: int = 0,
    *,
    tools: Sequence[Any] | None = None,
    chat_template: str | None = None,
) -> Contexts:
    """Token ids of the K + 1 replay contexts of one row (without the completion).

    Each context is tokenized whole, as TRL's GRPOTrainer tokenizes a prompt: a string with
    the tokenizer's special tokens (``tokenizer(text=...)``); chat messages through
    ``apply_chat_template`` with ``add_generation_prompt=True``, ``tokenize=True``, the same
    ``tools``, ``chat_template`` and ``chat_template_kwargs``.

    Args:
        tokenizer: a Hugging Face tokenizer (with a chat template when ``prompt`` is messages
            and no ``chat_template`` is given).
        prompt: the original prompt: a string, or chat messages (the information is appended to
            the last user turn's text: its string content, or its last text part when the
            content is a list of ``{"type": "text", "text": ...}`` parts; other parts are
            refused).
        infos: K strings, the verifier information of each reward ("" appends nothing).
        mode: ``"leave_one_out"`` or ``"add_one"``.
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template`` (TRL's
            ``GRPOConfig.chat_template_kwargs``).
        row: the row's index, for error messages.
        tools: the tools rendered into the prompt (TRL's ``trainer.tools``; an empty list
            renders as None, as TRL does).
        chat_template: a template used instead of the tokenizer's (TRL's
            ``trainer.chat_template``, set when it trains with tools).

    Returns:
        ``Contexts`` whose prefix is the longest common token prefix of the K + 1 contexts.
    """
    texts = [_appended_text(pieces) for pieces in context_infos(infos, mode)]
    distinct = list(dict.fromkeys(texts))  # e.g. empty infos make contexts equal: render once
    check_prompt(prompt, row, tokenizer, chat_template)
    if isinstance(prompt, str):
        ids = [tokenizer(text=prompt + text)["input_ids"] for text in distinct]
    else:
        ids = tokenizer.apply_chat_template(
            conversation=[_with_information(prompt, text) for text in distinct],
            tools=tools or None,
            chat_template=chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **dict(chat_template_kwargs or {}),
        )["input_ids"]
    ids_of = dict(zip(distinct, ids, strict=True))
    return Contexts.split([ids_of[text] for text in texts])


def contexts_of_rows(
    tokenizer: Any,
    prompts: Sequence[str | Sequence[Mapping[str, Any]]],
    infos: Sequence[Sequence[str]],
    mode: str = "leave_one_out",
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Any] | None = None,
    chat_template: str | None = None,
    needed: Sequence[bool] | None = None,
) -> list[Contexts | None]:
    """``build_contexts`` of every row (prompts[i] with infos[i]), errors naming the row; None
    for a row whose ``needed[i]`` is False (default: every row is needed)."""
    return [
        build_contexts(
            tokenizer,
            prompt,
            row_infos,
            mode,
            chat_template_kwargs,
            row,
            tools=tools,
            chat_template=chat_template,
        )
        if needed is None or needed[row]
        else None
        for row, (prompt, row_infos) in enumerate(zip(prompts, infos, strict=True))
    ]


def _prompt_key(prompt: str | Sequence[Mapping[str, Any]]) -> Hashable:
    return prompt if isinstance(prompt, str) else repr(prompt)


def share_prefixes(
    contexts: Sequence[Contexts | None], prompts: Sequence[str | Sequence[Mapping[str, Any]]]
) -> list[Contexts | None]:
    """The rows' contexts re-split so that rows with the same prompt have one prefix: the
    longest common token prefix of all their contexts (a row's own may reach a token or two
    further into its information, which would cost its group a prefix pass of its own). Rows
    without contexts (None) stay None."""
    rows_of: dict[Hashable, list[int]] = {}
    for row, prompt in enumerate(prompts):
        if contexts[row] is not None:
            rows_of.setdefault(_prompt_key(prompt), []).append(row)
    shared = list(contexts)
    for rows in rows_of.values():
        size = common_prefix_length([contexts[row].prefix for row in rows])
        for row in rows:
            shared[row] = contexts[row].cut(size)
    return shared


# ----------------------------------------------------------------------------- input checks


def check_inputs(
    prompts: Sequence[Any], completion_ids: Sequence[Any], infos: Sequence[Sequence[str]], mode: str
) -> tuple[list[list[int]], int]:
    """The replay's rows checked (each error names the argument and row): the completions as
    lists of ints, and K."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list (one prompt per row), not a string")
    if not len(prompts):
        raise ValueError("prompts is empty")
    if len(completion_ids) != len(prompts):
        raise ValueError(
            f"completion_ids has {len(completion_ids)} rows, prompts has {len(prompts)}"
        )
    if len(infos) != len(prompts):
        raise ValueError(f"infos has {len(infos)} rows, prompts has {len(prompts)}")
    num_rewards = None
    for row, row_infos in enumerate(infos):
        if isinstance(row_infos, str) or not all(isinstance(info, str) for info in row_infos):
            raise ValueError(f"infos[{row}] must be a list of K strings")
        if num_rewards is None:
            num_rewards = len(row_infos)
        elif len(row_infos) != num_rewards:
            raise ValueError(
                f"infos[{row}] has {len(row_infos)} entries, infos[0] has {num_rewards}: K must be equal"
            )
    if not num_rewards:
        raise ValueError("infos must hold at least one string per row (K >= 1)")
    completions = []
    for row, ids in enumerate(completion_ids):
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if not ids:
            raise ValueError(f"completion_ids[{row}] is empty: there is no token to replay")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"completion_ids[{row}] must hold integer token ids")
        completions.append(ids)
    return completions, num_rewards


def check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")

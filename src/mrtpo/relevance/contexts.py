"""The K + 1 replay contexts of a row, as token ids, built from its prompt and K informations.

For every response, the *same generated token ids* are teacher-forced after K + 1 contexts
(``docs/METHOD.md``, MRTPO, step 1): ``leave_one_out`` compares the prompt plus all K
verifiers' information (``full``) with the prompt plus all but reward k's (``minus_k``);
``add_one`` compares the bare prompt with the prompt plus reward k's information only.

The information goes after the original prompt (appended to the last user turn of chat
messages, then rendered by the chat template), so every context of a prompt shares the prompt
as a prefix, tokenized once. Also here: the checks of the replay's inputs (prompts, completion
ids, informations), which the replay and its naive reference share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

MODES = ("leave_one_out", "add_one")
INFO_SEPARATOR = "\n\n"  # between the original user content and each piece of information
_MARKER = "\u2063MRTPO-INFO\u2063"  # an invisible separator that no template or prompt contains


@dataclass(frozen=True)
class Contexts:
    """The K + 1 replay contexts of one row, as token ids.

    Context c is ``prefix + suffixes[c]`` (c = 0: the reference, ``full`` or the bare prompt;
    c = k >= 1: ``minus_k`` or ``plus_k``); the completion ids follow unchanged. ``prefix`` is
    the prompt rendered up to the end of its original (last user) content, tokenized once and
    shared by every context of the prompt.
    """

    prefix: tuple[int, ...]
    suffixes: tuple[tuple[int, ...], ...]

    def ids(self, context: int) -> list[int]:
        return [*self.prefix, *self.suffixes[context]]

    def sequence(self, context: int, completion: Sequence[int]) -> list[int]:
        """The ids teacher-forced for context ``context``: context ids then the completion."""
        return [*self.prefix, *self.suffixes[context], *completion]


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


def _render_chat(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], appended: str, template_kwargs: Mapping
) -> str:
    """Messages rendered with ``appended`` added to the last user turn's content."""
    messages = [dict(message) for message in messages]
    last_user = max(i for i, message in enumerate(messages) if message.get("role") == "user")
    messages[last_user]["content"] = messages[last_user]["content"] + appended
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **template_kwargs
    )


def _check_messages(prompt: Sequence[Any], row: int, tokenizer: Any) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"prompts[{row}] is a list of chat messages but the tokenizer has no chat template"
        )
    if not all(isinstance(message, Mapping) for message in prompt):
        raise ValueError(f"prompts[{row}] must be a string or a list of chat-message dicts")
    users = [m for m in prompt if m.get("role") == "user"]
    if not users:
        raise ValueError(f"prompts[{row}] has no user message to append verifier information to")
    if not isinstance(users[-1].get("content"), str):
        raise ValueError(f"prompts[{row}]: the last user message's content must be a string")


def _common_prefix(texts: Sequence[str]) -> str:
    first, last = min(texts), max(texts)
    size = 0
    while size < len(first) and first[size] == last[size]:
        size += 1
    return first[:size]


def build_contexts(
    tokenizer: Any,
    prompt: str | Sequence[Mapping[str, Any]],
    infos: Sequence[str],
    mode: str = "leave_one_out",
    chat_template_kwargs: Mapping[str, Any] | None = None,
    row: int = 0,
) -> Contexts:
    """Token ids of the K + 1 replay contexts of one row (without the completion).

    Args:
        tokenizer: a Hugging Face tokenizer (with a chat template when ``prompt`` is messages).
        prompt: the original prompt: a string, or chat messages (the information is appended to
            the last user turn's content, then rendered with ``add_generation_prompt=True``).
        infos: K strings, the verifier information of each reward ("" appends nothing).
        mode: ``"leave_one_out"`` or ``"add_one"``.
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template`` (e.g. tools).
        row: the row's index, for error messages.

    Returns:
        ``Contexts`` whose prefix is tokenized once and shared by all K + 1 contexts.
    """
    template_kwargs = dict(chat_template_kwargs or {})
    appended = [_appended_text(pieces) for pieces in context_infos(infos, mode)]
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"prompts[{row}] is empty: there is no context to replay after")
        # As TRL tokenizes a plain prompt: special tokens (e.g. BOS) on the prompt itself.
        prefix = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        suffixes = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in appended]
        return Contexts(tuple(prefix), tuple(tuple(s) for s in suffixes))

    _check_messages(prompt, row, tokenizer)
    marked = _render_chat(tokenizer, prompt, _MARKER, template_kwargs)
    texts = [_render_chat(tokenizer, prompt, text, template_kwargs) for text in appended]
    shared = marked[: marked.index(_MARKER)] if _MARKER in marked else ""
    if not all(text.startswith(shared) for text in texts):  # a template that rewrites content
        shared = _common_prefix(texts)
    if not shared:
        raise ValueError(f"prompts[{row}] renders to an empty shared prefix")
    # Rendered chat text carries its own special tokens (TRL tokenizes it the same way).
    prefix = tokenizer(shared, add_special_tokens=False)["input_ids"]
    suffixes = [
        tokenizer(text[len(shared) :], add_special_tokens=False)["input_ids"] for text in texts
    ]
    return Contexts(tuple(prefix), tuple(tuple(s) for s in suffixes))


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

"""Tokenize chat conversations, optionally with a mask of the tokens that carry loss.

Shared by the orchestrator (episode prompts) and SFT data (loss masks), so it sits outside both:
the orchestrator imports nothing from the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]
# Which tokens carry loss: every assistant turn, every token, or only the last assistant turn.
LossOn = Literal["assistant", "all", "last_turn"]


def encode_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """The conversation's token ids; `tools` (OpenAI-style schemas) and `template_kwargs` (e.g.
    Qwen3's `enable_thinking`) go to the chat template."""
    schemas: list[dict[Any, Any] | Callable[..., Any]] | None = None if tools is None else [*tools]
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        tools=schemas,
        **template_kwargs,
    )
    return list(ids)


def tokenize_with_assistant_mask(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    loss_on: LossOn = "assistant",
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[bool]]:
    """Token ids of the whole conversation, and True for the tokens that carry loss (`loss_on`);
    `tools` (OpenAI-style schemas) are rendered by the template as in `encode_chat`.

    Each trained assistant turn is found as the difference between the conversation rendered up to
    it (with the generation prompt) and rendered through it, which works for any chat template whose
    renderings extend each other; one that does not is an error rather than a silently wrong mask.
    Tool results are not assistant turns (Qwen3's template renders them in a user turn): no loss.
    """
    whole = encode_chat(tokenizer, messages, add_generation_prompt=False, tools=tools)
    if loss_on == "all":
        return whole, [True] * len(whole)
    assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    trained = assistant_turns[-1:] if loss_on == "last_turn" else assistant_turns
    ids: list[int] = []
    mask: list[bool] = []
    for i in trained:
        prefix = encode_chat(tokenizer, messages[:i], add_generation_prompt=True, tools=tools)
        full = encode_chat(tokenizer, messages[: i + 1], add_generation_prompt=False, tools=tools)
        if full[: len(prefix)] != prefix or prefix[: len(ids)] != ids:
            raise ValueError("the chat template re-renders earlier turns; cannot mask assistant tokens")
        mask += [False] * (len(prefix) - len(ids)) + [True] * (len(full) - len(prefix))
        ids = full
    if whole[: len(ids)] != ids:
        raise ValueError("the chat template re-renders earlier turns; cannot mask assistant tokens")
    mask += [False] * (len(whole) - len(ids))
    return whole, mask

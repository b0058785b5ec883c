"""What both loops share: the connection to a Tinker API server, the reverse-text task (write a word
backwards, scored 0..1 by similarity), and turning a chat into model tokens. Plain `tinker` SDK and
the tokenizer it hands out: nothing of lorarl is imported, so these loops run against any server of
the Tinker API.
"""

from __future__ import annotations

import difflib
import os
import random

import tinker
from tinker import types

WORDS = (
    "apple river stone cloud light green music paper table water bread chair dream earth field "
    "glass honey island jelly kite lemon money night ocean piano queen robot sugar tiger umbrella"
).split()
SYSTEM = "Reverse the text."


def connect() -> tinker.ServiceClient:
    """The server at TINKER_BASE_URL (default: a local lorarl-serve), with TINKER_API_KEY (default: a
    local key; lorarl-serve on loopback without serve.api_key takes any key starting with 'tml-')."""
    return tinker.ServiceClient(
        base_url=os.environ.get("TINKER_BASE_URL", "http://127.0.0.1:8000"),
        api_key=os.environ.get("TINKER_API_KEY", "tml-local-example"),
    )


def served_model(service: tinker.ServiceClient) -> str:
    return service.get_server_capabilities().supported_models[0].model_name


def example(rng: random.Random) -> str:
    return rng.choice(WORDS)


def reward(completion: str, word: str) -> float:
    return difflib.SequenceMatcher(None, completion.strip(), word[::-1]).ratio()


def prompt_tokens(tokenizer, word: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The chat up to the assistant's turn, as token ids."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": word}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def supervised_datum(tokenizer, word: str) -> types.Datum:  # type: ignore[no-untyped-def]
    """The prompt and the right answer (with the end of the turn), weighted on the answer only."""
    prompt = prompt_tokens(tokenizer, word)
    answer = tokenizer.encode(word[::-1], add_special_tokens=False) + [tokenizer.eos_token_id]
    tokens = prompt + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )

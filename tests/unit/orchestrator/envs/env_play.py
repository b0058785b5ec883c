"""Play an environment by hand, as the orchestrator's EpisodeRunner does, with scripted answers."""

import asyncio
import inspect

from lorarl.orchestrator.envs.base import Environment, Episode


def play_by_hand(env: Environment, example: dict, answers: list[str]) -> Episode:
    """At most max_turns model turns, env_response after each but the last, until it ends the episode."""
    return asyncio.run(play_turns(env, example, answers))


async def play_turns(env: Environment, example: dict, answers: list[str]) -> Episode:
    """`play_by_hand` on the caller's event loop (an environment may keep tasks running on it)."""
    episode = Episode(example, env.prompt(example))
    for turn, answer in enumerate(answers[: env.max_turns], 1):
        episode.messages.append({"role": "assistant", "content": answer})
        reply = env.env_response(episode) if turn < env.max_turns else None
        if inspect.isawaitable(reply):
            reply = await reply
        if reply is None:
            break
        episode.messages += reply
    return episode


def play_and_score(env: Environment, example: dict, answers: list[str]) -> tuple[Episode, dict[str, float]]:
    """`play_turns`, then the episode's scores, on one event loop as the orchestrator does."""

    async def both() -> tuple[Episode, dict[str, float]]:
        episode = await play_turns(env, example, answers)
        return episode, await env.score(episode)

    return asyncio.run(both())

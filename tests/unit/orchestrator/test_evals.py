import asyncio

from lorarl.config.orchestrator import EvalConfig
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.evals import MAX_GROUPS_IN_FLIGHT, Evaluator


def test_evals_are_claimed_at_zero_every_interval_and_at_the_end_once() -> None:
    ev = Evaluator(EvalConfig(interval=4, num_examples=2), [load_environment("reverse_text")], max_steps=10)
    assert [v for v in range(11) if ev.claim(v)] == [0, 4, 8, 10]
    assert not ev.claim(4)  # each once
    resumed = Evaluator(EvalConfig(interval=4, num_examples=2), [load_environment("reverse_text")], 10, done_through=4)
    assert [v for v in range(11) if resumed.claim(v)] == [8, 10]


async def _rewards(values: list[float]) -> list[float]:
    return values


def test_avg_and_pass_at_k() -> None:
    env = load_environment("reverse_text")
    ev = Evaluator(EvalConfig(num_examples=2, rollouts_per_example=3), [env], max_steps=10)
    scripted = iter([[0.0, 1.0, 0.5], [0.2, 0.2, 0.2]])
    metrics = asyncio.run(ev.run(0, lambda env, ex, n: _rewards(next(scripted))))
    assert metrics["eval/reverse_text/avg@3"] == (1.5 + 0.6) / 6
    assert metrics["eval/reverse_text/pass@3"] == (1.0 + 0.2) / 2


def test_the_held_out_examples_are_the_same_at_every_eval() -> None:
    envs = [load_environment("reverse_text")]
    assert Evaluator(EvalConfig(), envs, 5).sets[0][1] == Evaluator(EvalConfig(), envs, 5).sets[0][1]


def test_an_evals_groups_play_concurrently_up_to_the_bound() -> None:
    env = load_environment("reverse_text")
    num = MAX_GROUPS_IN_FLIGHT * 2 + 3
    ev = Evaluator(EvalConfig(num_examples=num, rollouts_per_example=2), [env], max_steps=10)
    solved = ev.sets[0][1][0]
    in_flight, most = 0, 0

    async def play(env: Environment, example: Example, n: int) -> list[float]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return [float(example is solved)] * n

    metrics = asyncio.run(ev.run(0, play))
    assert most == MAX_GROUPS_IN_FLIGHT
    assert metrics["eval/reverse_text/pass@2"] == 1 / num  # every group counted, once

import json
from collections import Counter

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.sampler import ExampleSampler


def mixed() -> ExampleSampler:
    envs = [load_environment("reverse_text"), load_environment("math")]
    return ExampleSampler(envs, [3.0, 1.0], seed=7)


def test_environments_are_mixed_by_weight() -> None:
    sampler = mixed()
    counts = Counter(sampler.draw()[0].name for _ in range(4000))
    assert abs(counts["reverse_text"] / 4000 - 0.75) < 0.03
    assert sampler.drawn == [counts["reverse_text"], counts["math"]]


def test_a_restored_sampler_continues_with_the_same_draws() -> None:
    straight = mixed()
    for _ in range(50):
        straight.draw()
    state = json.loads(json.dumps(straight.state_dict()))  # as a checkpoint stores it
    expected = [straight.draw() for _ in range(20)]

    resumed = mixed()
    resumed.load_state_dict(state)
    assert [(env.name, ex) for env, ex in (resumed.draw() for _ in range(20))] == [
        (env.name, ex) for env, ex in expected
    ]

"""serve/sampling.py's own logic, without vLLM: what a request asks of vLLM and what is refused before
it is sent (tests/integration/serve/test_sampling.py runs them against the real server)."""

from __future__ import annotations

import pytest

from lorarl.serve.ops import BadRequest
from lorarl.serve.sampling import SamplingParams, check_request, completion_body, top_k


def test_stop_maps_to_vllms_stop_strings_token_ids_or_no_stop_at_all() -> None:
    def stops(stop: str | list[str] | list[int] | None) -> dict[str, object]:
        body = completion_body([1], 1, 5, SamplingParams(stop=stop))
        return {k: body[k] for k in ("stop", "stop_token_ids", "ignore_eos") if k in body}

    assert stops(None) == {}
    assert stops("\n") == {"stop": ["\n"]}
    assert stops(["a", "bc"]) == {"stop": ["a", "bc"]}
    assert stops([7, 9]) == {"stop_token_ids": [7, 9]}
    assert stops([]) == {"ignore_eos": True}


def test_max_tokens_defaults_to_what_seq_len_leaves() -> None:
    assert check_request([1, 2, 3], 1, SamplingParams(), 0, seq_len=16, vocab=10) == 13
    assert check_request([1, 2, 3], 1, SamplingParams(max_tokens=13), 0, seq_len=16, vocab=10) == 13
    with pytest.raises(BadRequest, match=r"^sampling_params.max_tokens: prompt \(16 tokens\) \+ one token"):
        check_request([1] * 16, 1, SamplingParams(), 0, seq_len=16, vocab=10)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=float("nan")), "sampling_params.temperature"),
        (SamplingParams(top_p=1.5), "sampling_params.top_p"),
        (SamplingParams(stop=""), "sampling_params.stop: an empty stop string"),
        (SamplingParams(stop=["a", 1]), "sampling_params.stop: either stop strings or stop token ids"),  # type: ignore[list-item]
        (SamplingParams(stop=[-1]), "sampling_params.stop: token -1"),
    ],
)
def test_params_out_of_range_are_refused_naming_the_field(params: SamplingParams, field: str) -> None:
    with pytest.raises(BadRequest) as refused:
        check_request([1, 2], 1, params, 0, seq_len=16, vocab=10)
    assert str(refused.value).startswith(field)


def test_greedy_and_no_limit_are_accepted() -> None:
    assert check_request([1], 3, SamplingParams(max_tokens=2, temperature=0.0, top_k=-1), 5, 16, 10) == 2


def test_top_k_prompt_logprobs_are_the_k_best_of_vllms_entry_most_likely_first() -> None:
    entry = {
        "5": {"logprob": -3.0, "rank": 7},  # the prompt token, outside the top 2
        "8": {"logprob": -0.5, "rank": 1},
        "2": {"logprob": -1.0, "rank": 2},
    }
    assert top_k(entry, 2) == [(8, -0.5), (2, -1.0)]
    entry["5"]["rank"] = 2  # the prompt token among them: vLLM lists it once
    del entry["2"]
    assert top_k(entry, 2) == [(8, -0.5), (5, -3.0)]

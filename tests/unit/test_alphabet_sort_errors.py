"""scripts/alphabet_sort_errors.py's census: each wrong turn put down to one kind of mistake, and the
names each later turn should list, old and new, counted right or not."""

from __future__ import annotations

import pytest

from lorarl.orchestrator.envs.alphabet_sort import expected_turns
from lorarl.orchestrator.envs.base import Episode
from tests.unit.test_learning_check import script

# Sorted by LAST name: the second turn's list is Ada Chen (new), Bo Diaz, Cy Evans (new).
WANT = expected_turns("last", [["Bo Diaz"], ["Cy Evans", "Ada Chen"]])[1]


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ("Ada Chen // new name!\nBo Diaz\nCy Evans // new name!", "exact"),
        ("  Ada Chen // new name!\n\nBo Diaz\nCy Evans // new name!  ", "exact"),  # spacing is no mistake
        ("Ada Diaz // new name!\nBo Diaz\nCy Evans // new name!", "foreign"),  # first name bound to another last
        ("Ada Chen // new name!\nCy Evans // new name!", "count"),
        ("Ada Chen // new name!\nBo Diaz\nBo Diaz\nCy Evans // new name!", "count"),
        ("Bo Diaz\nAda Chen // new name!\nCy Evans // new name!", "order"),
        ("Ada Chen // new name!\nBo Diaz // new name!\nCy Evans // new name!", "mark"),
    ],
)
def test_turn_error_names_the_mistake(answer: str, kind: str) -> None:
    assert script("alphabet_sort_errors").turn_error(answer, WANT) == kind


def test_names_listed_counts_each_later_turns_old_and_new_names() -> None:
    example = {"turns": [["Bo Diaz"], ["Cy Evans", "Ada Chen"]], "expected": ["Bo Diaz // new name!", WANT]}
    messages = [{"role": "assistant", "content": "Bo Diaz // new name!"},
                {"role": "assistant", "content": "Ada Chen // new name!\nBo Diaz\nCy Adler // new name!"}]  # fmt: skip
    listed = script("alphabet_sort_errors").names_listed(Episode(example, messages))
    assert sorted(listed) == [("new", False), ("new", True), ("old", True)]

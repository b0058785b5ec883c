"""Bad input to `rl`, the served-adapter check's part of the table (docs/served_check.md): its two
keys refused in one line naming the key as the config loads (so a start and --dry-run alike), with
nothing written (`bad_inputs.assert_refused`)."""

from __future__ import annotations

import pytest

from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, rl_args

CASES: list[Case] = [
    ("rl", rl_args("--inference.served_check", "strict"), "inference.served_check"),
    ("rl", rl_args("--inference.served_check", ""), "inference.served_check"),
    ("rl", rl_args("--inference.served_check_tolerance", "0"), "inference.served_check_tolerance"),
    ("rl", rl_args("--inference.served_check_tolerance", "-1e-3"), "inference.served_check_tolerance"),
    ("rl", rl_args("--inference.served_check_tolerance", "loose"), "inference.served_check_tolerance"),
]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_rl_refuses_bad_served_check_keys(ws: Workspace, capsys: pytest.CaptureFixture[str], case: Case) -> None:
    command, argv, names = case
    assert_refused(ws, capsys, command, argv(ws), names)

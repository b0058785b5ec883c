"""serve/auth.py and the [serve] key checks: which keys pass, that the owner id is a hash and never the
key, and that a server off loopback without a key is refused in one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.cli.common import load_run_or_exit
from lorarl.config.serve import ServeConfig, ServeRunMode, ServeSection
from lorarl.serve.auth import Keys, Unauthorized, read_keys_file


def test_api_key_alone_passes() -> None:
    keys = Keys(ServeSection(api_key="tml-one"))
    assert keys.owner("tml-one")
    for other in ("tml-two", "one", "", None):
        with pytest.raises(Unauthorized):
            keys.owner(other)


def test_keys_file_ignores_blank_and_comment_lines(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# the team\n\ntml-a\n  tml-b  \n#tml-c\n   \n")
    assert read_keys_file(path.read_text()) == {"tml-a", "tml-b"}
    keys = Keys(ServeSection(api_key="tml-x", keys_file=path))
    for ok in ("tml-a", "tml-b", "tml-x"):
        keys.owner(ok)
    for refused in ("tml-c", "#tml-c", "# the team", "tml-other"):
        with pytest.raises(Unauthorized, match="not accepted"):
            keys.owner(refused)


def test_loopback_without_keys_takes_any_tml_key_each_a_tenant() -> None:
    keys = Keys(ServeSection())
    assert keys.owner("tml-a") != keys.owner("tml-b")
    assert keys.owner("tml-a") == keys.owner("tml-a")
    for refused in ("sk-a", "TML-a", "a"):
        with pytest.raises(Unauthorized, match="not accepted"):
            keys.owner(refused)
    with pytest.raises(Unauthorized, match="TINKER_API_KEY"):
        keys.owner(None)


def test_owner_is_a_hash_never_the_key() -> None:
    owner = Keys(ServeSection()).owner("tml-secret")
    assert "secret" not in owner and "tml-" not in owner
    assert len(owner) == 32 and int(owner, 16) >= 0


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::"])
def test_off_loopback_without_a_key_is_refused_naming_the_key(host: str) -> None:
    with pytest.raises(ValueError, match=r"serve\.api_key \(or serve\.keys_file\) is required"):
        ServeSection(host=host)
    ServeSection(host=host, api_key="tml-k")


def test_off_loopback_without_a_key_exits_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'output_dir = "{tmp_path}/out"\n[model]\nname = "m"\n[serve]\nhost = "0.0.0.0"\n')
    with pytest.raises(SystemExit) as exit:
        load_run_or_exit(ServeConfig, ServeRunMode, ["@", str(cfg)])
    assert exit.value.code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "serve.api_key" in err and "Traceback" not in err

"""Plugins are declared, not guessed: what `lorarl.plugin` marks, what the loaders of each kind accept
and refuse (on the trainer's and orchestrator's side too, which load without `rl`'s checks), how a
module that fails to import is reported, and env args checked and converted by the factory's
signature and annotations. User modules are written to a temporary folder on sys.path."""

from __future__ import annotations

import importlib
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel

import lorarl
from lorarl.config.algorithms import CustomAdvantage, CustomLoss
from lorarl.orchestrator.advantages import advantage_estimator
from lorarl.orchestrator.envs import check_environment, load_environment, resolve_environment
from lorarl.orchestrator.envs.base import Environment
from lorarl.orchestrator.envs.reverse_text import ReverseText
from lorarl.plugins import ArgsError, PluginError, declared_kind, fit_args, import_user_module, load_function
from lorarl.trainer.losses import BUILTIN, policy_term


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], str]:
    """Writes `name`.py (dedented) into a folder on sys.path; returns the module's name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source).replace("ROOT", str(tmp_path)))
        importlib.invalidate_caches()
        return name

    return write


def test_plugin_marks_the_function_itself_with_its_kind() -> None:
    def f() -> None: ...

    assert lorarl.plugin("loss")(f) is f and declared_kind(f) == "loss"
    assert declared_kind(print) is None and declared_kind(lambda: None) is None


def test_plugin_refuses_an_unknown_kind_and_what_is_not_a_function() -> None:
    with pytest.raises(ValueError, match="plugin kind 'reward': give one of environment, loss, advantage"):
        lorarl.plugin("reward")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="marks functions, not a type"):
        lorarl.plugin("environment")(ReverseText)


@lorarl.plugin("loss")
def declared_loss(inputs: object) -> object:
    return inputs


def test_a_function_loads_only_as_the_kind_it_was_declared() -> None:
    spec = f"{__name__}:declared_loss"
    assert load_function(spec, "trainer.loss.fn", "loss") is declared_loss
    assert policy_term(CustomLoss(fn=spec)) == (declared_loss, {})  # the trainer's loader
    with pytest.raises(PluginError, match="is declared a lorarl loss plugin: mark the function you mean with"):
        load_function(spec, "orchestrator.advantage.fn", "advantage")
    with pytest.raises(PluginError, match="is declared a lorarl loss plugin"):
        resolve_environment(spec)


def test_the_orchestrator_and_trainer_refuse_undeclared_functions_without_calling_them(tmp_path: Path) -> None:
    folder = tmp_path / "precious"
    folder.mkdir()
    with pytest.raises(PluginError, match="shutil.rmtree is not declared a lorarl environment plugin"):
        load_environment("shutil:rmtree", {"path": str(folder)})
    with pytest.raises(PluginError, match="orchestrator.advantage.fn 'shutil:rmtree': shutil.rmtree is not declared"):
        advantage_estimator(CustomAdvantage(fn="shutil:rmtree"))
    with pytest.raises(PluginError, match="trainer.loss.fn 'os:remove': posix.remove is not declared"):
        policy_term(CustomLoss(fn="os:remove"))
    assert folder.is_dir()


def test_the_built_in_losses_and_estimators_are_declared_as_a_users_are() -> None:
    """One family: a built-in loads through the same check as a user's plugin."""
    from lorarl.orchestrator import advantages

    for name, fn in BUILTIN.items():
        assert load_function(f"lorarl.trainer.losses:{name}", "trainer.loss.fn", "loss") is fn
    for name, estimator in advantages.BUILTIN.items():
        assert (
            load_function(f"lorarl.orchestrator.advantages:{name}", "orchestrator.advantage.fn", "advantage")
            is estimator
        )


def test_an_environment_is_a_subclass_an_annotated_function_or_a_declared_one(
    write_module: Callable[[str, str], str],
) -> None:
    module = write_module(
        "plugins_envs",
        """
        from __future__ import annotations
        import lorarl
        from lorarl.orchestrator.envs.base import Environment
        from lorarl.orchestrator.envs.reverse_text import ReverseText

        class Mine(ReverseText):
            pass

        def annotated(n: int = 2) -> ReverseText:  # a string annotation, resolved
            return ReverseText(max_words=n)

        @lorarl.plugin("environment")
        def declared(n: int = 2):
            return ReverseText(max_words=n)

        @lorarl.plugin("environment")
        def declared_int() -> int:
            return 0

        def bare():
            return ReverseText()

        def unresolved() -> NoSuchType:  # noqa: F821
            return ReverseText()
        """,
    )
    for name in ("Mine", "annotated", "declared"):
        assert isinstance(load_environment(f"{module}:{name}", {"n": 3} if name != "Mine" else {}), ReverseText)
    with pytest.raises(PluginError, match="plugins_envs:declared_int returns int, not an Environment"):
        resolve_environment(f"{module}:declared_int")
    for name in ("bare", "unresolved"):
        with pytest.raises(PluginError, match=f"plugins_envs.{name} is not declared a lorarl environment plugin"):
            resolve_environment(f"{module}:{name}")


def test_a_module_that_fails_to_import_is_one_line_with_its_file_line_and_error(
    write_module: Callable[[str, str], str], tmp_path: Path
) -> None:
    write_module("plugins_helper", "import json\n\ndef load():\n    return json.loads('{bad')\n")
    cases = {
        "plugins_syntax": ("x = 1\ndef f(:\n    pass\n", "plugins_syntax.py:2: SyntaxError: invalid syntax"),
        # Raised in a library called from the user's helper module: the user's innermost line is named.
        "plugins_nested": (
            "import plugins_helper\nDATA = plugins_helper.load()\n",
            "plugins_helper.py:4: JSONDecodeError",
        ),
        "plugins_exit": ("import sys\nsys.exit('no')\n", "plugins_exit.py:2: SystemExit: no"),
        "plugins_dep": ("import no_such_dep_of_plugins\n", "plugins_dep.py:1: ModuleNotFoundError"),
    }
    for name, (source, where) in cases.items():
        write_module(name, source)
        with pytest.raises(PluginError) as e:
            import_user_module(name)
        assert str(e.value).startswith(f"cannot import {name}: {tmp_path}/{where}"), str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(PluginError, match="^No module named 'plugins_absent'$"):
        import_user_module("plugins_absent")


class Point(BaseModel):
    x: int


class Opaque:
    """A type pydantic has no schema for: checked by isinstance."""


def factory(
    size: int,
    ratio: float = 1.0,
    names: list[str] | None = None,
    point: Point | None = None,
    thing: Opaque | None = None,
    **extra: bool,
) -> Environment:
    raise AssertionError("never called by fit_args")


def test_env_args_are_checked_and_converted_by_the_factorys_annotations() -> None:
    fitted = fit_args(factory, {"size": "3", "ratio": 2, "names": ("a",), "point": {"x": "4"}, "flag": 1})
    assert fitted == {"size": 3, "ratio": 2.0, "names": ["a"], "point": Point(x=4), "flag": True}
    assert fit_args(factory, {"size": 1, "thing": (o := Opaque())})["thing"] is o
    bad = {
        "size": ({"size": "big"}, "args.size = 'big': factory takes size: int (Input should be a valid integer"),
        "names": ({"size": 1, "names": "ab"}, "args.names = 'ab': factory takes names: list[str] | None"),
        "point": ({"size": 1, "point": {"y": 1}}, "args.point = {'y': 1}: factory takes point: "),
        "thing": ({"size": 1, "thing": 3}, "args.thing = 3: factory takes thing: "),
        "extra": ({"size": 1, "flag": "maybe"}, "args.flag = 'maybe': factory takes flag: bool"),
        "missing": ({}, "args do not fit factory: missing a required argument: 'size'"),
    }
    for args, message in bad.values():
        with pytest.raises(ArgsError) as e:
            fit_args(factory, args)
        assert str(e.value).startswith(message), str(e.value)


def test_env_args_of_unresolved_annotations_are_checked_by_name_alone(write_module: Callable[[str, str], str]) -> None:
    module = write_module(
        "plugins_unresolved",
        """
        from __future__ import annotations
        from typing import TYPE_CHECKING
        from lorarl.orchestrator.envs.reverse_text import ReverseText
        if TYPE_CHECKING:
            from somewhere import Options

        class Env(ReverseText):
            def __init__(self, options: Options | None = None) -> None:
                super().__init__()
                self.options = options
        """,
    )
    assert load_environment(f"{module}:Env", {"options": "anything"}).options == "anything"  # type: ignore[attr-defined]
    with pytest.raises(ArgsError, match="unexpected keyword argument 'nope'"):
        check_environment(f"{module}:Env", {"nope": 1})


def test_built_environments_get_their_args_converted() -> None:
    env = load_environment("reverse_text", {"min_words": "2", "max_words": 3.0})
    assert isinstance(env, ReverseText) and (env.min_words, env.max_words) == (2, 3)

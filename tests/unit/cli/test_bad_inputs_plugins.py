"""Bad input to `rl`, the plugins' part of the table: config keys that name code to run
(`[[orchestrator.env]] id`, `trainer.loss.fn`, `orchestrator.advantage.fn`) and the env args
given to it. Each case is refused by `rl --dry-run` (which makes every check a real run makes) in one
line naming the key, with no traceback and no file written or deleted (`bad_inputs.assert_refused`).

The functions named here would, if called, delete or write files of the workspace (`shutil:rmtree`
of the user's folder, `subprocess:run` of `touch`, a user's function that writes a file): the
unchanged workspace shows that none of them ran. User modules are written to the workspace's
inputs/ folder and imported from there as `inputs.<name>`; Python's bytecode cache is off while
the cases run, since it, not lorarl, would write into that folder.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, rl_args

# User modules, by name; ROOT becomes the workspace's folder. Each undeclared function would leave a
# file behind if it were ever called.
MODULES = {
    "plug_syntax": "import lorarl\n\n@lorarl.plugin('environment')\ndef make(:\n    pass\n",
    "plug_indent": "import lorarl\n\n@lorarl.plugin('loss')\ndef my_loss(inputs):\nreturn inputs\n",
    "plug_raises": "import lorarl\n\nSETTINGS = {}\nLIMIT = SETTINGS['limit']\n",
    "plug_exits": "import sys\n\nsys.exit(3)\n",
    "plug_missing_dep": "import lorarl\nimport no_such_dependency_of_plugins\n",
    "plug_bad_json": "import json\n\nCONFIG = json.loads('{not json')\n",
    "plug_user": """\
import functools
import lorarl
from lorarl.orchestrator.envs.base import Environment
from lorarl.orchestrator.envs.reverse_text import ReverseText


def _touch(name):
    open('ROOT/' + name, 'w').close()


def make_env(**args):  # undeclared: no mark, no return annotation
    _touch('called-make_env')
    return ReverseText(**args)


def make_dict(**args) -> dict:
    _touch('called-make_dict')
    return {}


@lorarl.plugin('environment')
def make_int(**args) -> int:
    _touch('called-make_int')
    return 0


@lorarl.plugin('loss')
def a_loss(inputs):
    _touch('called-a_loss')
    return inputs.logprobs


@lorarl.plugin('advantage')
def an_advantage(rewards):
    _touch('called-an_advantage')
    return rewards


@lorarl.plugin('advantage')
async def async_advantage(rewards):
    _touch('called-async_advantage')
    return rewards


@lorarl.plugin('advantage')
def generated_advantage(rewards):
    _touch('called-generated_advantage')
    yield from rewards


@lorarl.plugin('advantage')
def scaled(rewards: list[float], *, scale: float = 1.0) -> list[float]:
    _touch('called-scaled')
    return [scale * r for r in rewards]


def undeclared_advantage(rewards):
    _touch('called-undeclared_advantage')
    return rewards


@lorarl.plugin('environment')
def sized(size: int, words: list[str] | None = None) -> Environment:
    _touch('called-sized')
    return ReverseText(min_words=1, max_words=size, words=words)


class NotAnEnvironment:
    def __init__(self, **args):
        _touch('called-NotAnEnvironment')


class CallableThing:
    def __call__(self, *args, **kwargs):
        _touch('called-CallableThing')


LAMBDA = lambda **args: _touch('called-LAMBDA')  # noqa: E731
PARTIAL = functools.partial(_touch, 'called-PARTIAL')
INSTANCE = CallableThing()
AN_ENV = ReverseText()
""",
}


def with_module(name: str, *args: str) -> Callable[[Workspace], list[str]]:
    """`rl_args(*args)`, once the user module `name` (of MODULES) is in the workspace's inputs/."""

    def build(w: Workspace) -> list[str]:
        w.write(f"{name}.py", MODULES[name].replace("ROOT", str(w.root)))
        return rl_args(*args)(w)

    return build


def env(env_id: str, args: dict[str, object] | None = None) -> tuple[str, str]:
    return "--orchestrator.env", json.dumps([{"id": env_id, "args": args or {}}])


def loss(spec: str) -> tuple[str, ...]:
    return "--trainer.loss.type", "custom", "--trainer.loss.fn", spec


def advantage(spec: str) -> tuple[str, ...]:
    return "--orchestrator.advantage.type", "custom", "--orchestrator.advantage.fn", spec


UNDECLARED = "is not declared a lorarl"
SCALE = ("--orchestrator.advantage.args",)
CASES: list[Case] = [
    # Taken, then called each step for a coroutine or a generator; args pydantic's lax mode let through.
    ("rl", with_module("plug_user", *advantage("inputs.plug_user:async_advantage")), "is an async function"),
    ("rl", with_module("plug_user", *advantage("inputs.plug_user:generated_advantage")), "is a generator function"),
    (
        "rl",
        with_module("plug_user", *advantage("inputs.plug_user:scaled"), *SCALE, '{"scale": true}'),
        "args.scale = True: scaled takes scale: float (true or false is not a number",
    ),
    (
        "rl",
        with_module("plug_user", *advantage("inputs.plug_user:scaled"), *SCALE, '{"scale": NaN}'),
        "args.scale = nan: scaled takes scale: float (NaN is not a number",
    ),
    # Functions of the standard library, which no one declared, named as an environment: refused unrun.
    ("rl", rl_args(*env("shutil:rmtree", {"path": "{w.user}"})), "id 'shutil:rmtree': not an Environment class"),
    ("rl", rl_args(*env("subprocess:run", {"args": ["touch", "{w.root}/pwned"]})), "subprocess.run " + UNDECLARED),
    ("rl", rl_args(*env("os:remove", {"path": "{w.user}/chapter1.tex"})), "posix.remove " + UNDECLARED),
    ("rl", rl_args(*env("os:unlink", {"path": "{w.user}/chapter1.tex"})), "id 'os:unlink': not an Environment"),
    ("rl", rl_args(*env("builtins:eval", {"source": "open('{w.root}/pwned', 'w')"})), "builtins.eval " + UNDECLARED),
    ("rl", rl_args(*env("builtins:exec", {"source": "import os"})), "builtins.exec " + UNDECLARED),
    ("rl", rl_args(*env("shutil:move", {"src": "{w.user}", "dst": "{w.root}/moved"})), "shutil.move " + UNDECLARED),
    ("rl", rl_args(*env("os:makedirs", {"name": "{w.root}/made"})), "os.makedirs " + UNDECLARED),
    ("rl", rl_args(*env("tempfile:mkdtemp", {"dir": "{w.root}"})), "tempfile.mkdtemp " + UNDECLARED),
    ("rl", rl_args(*env("pathlib:Path", {})), "pathlib.Path " + UNDECLARED),
    ("rl", rl_args(*env("lorarl.tiny_model:save_tiny_model", {"path": "{w.root}/tiny"})), UNDECLARED),
    # ... as a custom loss, and as an advantage estimator.
    ("rl", rl_args(*loss("shutil:rmtree")), "trainer.loss.fn 'shutil:rmtree': shutil.rmtree " + UNDECLARED),
    ("rl", rl_args(*loss("subprocess:run")), "trainer.loss.fn 'subprocess:run'"),
    (
        "rl",
        rl_args(*loss("os:remove")),
        'posix.remove is not declared a lorarl loss plugin: mark the function you mean with @lorarl.plugin("loss")',
    ),
    ("rl", rl_args(*loss("builtins:eval")), "trainer.loss.fn 'builtins:eval': builtins.eval " + UNDECLARED),
    ("rl", rl_args(*loss("lorarl.trainer.loss:policy_loss")), "lorarl.trainer.loss.policy_loss " + UNDECLARED),
    (
        "rl",
        rl_args(*advantage("shutil:rmtree")),
        "orchestrator.advantage.fn 'shutil:rmtree': shutil.rmtree " + UNDECLARED,
    ),
    ("rl", rl_args(*advantage("subprocess:call")), "orchestrator.advantage.fn 'subprocess:call'"),
    (
        "rl",
        rl_args(*advantage("os:system")),
        'posix.system is not declared a lorarl advantage plugin: mark the function you mean with @lorarl.plugin("adv',
    ),
    ("rl", rl_args(*advantage("builtins:exec")), "orchestrator.advantage.fn 'builtins:exec'"),
    ("rl", rl_args(*advantage("statistics:mean")), "statistics.mean " + UNDECLARED),  # it would even work
    # A user's module that fails to import: its file, line and error.
    (
        "rl",
        with_module("plug_syntax", *env("inputs.plug_syntax:make")),
        "plug_syntax.py:4: SyntaxError: invalid syntax",
    ),
    (
        "rl",
        with_module("plug_indent", *loss("inputs.plug_indent:my_loss")),
        "plug_indent.py:5: IndentationError: expected an indented block",
    ),
    ("rl", with_module("plug_raises", *env("inputs.plug_raises:make")), "plug_raises.py:4: KeyError: 'limit'"),
    (
        "rl",
        with_module("plug_raises", *advantage("inputs.plug_raises:adv")),
        "orchestrator.advantage.fn 'inputs.plug_raises:adv': cannot import inputs.plug_raises",
    ),
    ("rl", with_module("plug_exits", *env("inputs.plug_exits:make")), "plug_exits.py:3: SystemExit: 3"),
    (
        "rl",
        with_module("plug_missing_dep", *loss("inputs.plug_missing_dep:f")),
        "plug_missing_dep.py:2: ModuleNotFoundError: No module named 'no_such_dependency_of_plugins'",
    ),
    ("rl", with_module("plug_bad_json", *env("inputs.plug_bad_json:make")), "plug_bad_json.py:3: JSONDecodeError"),
    # A user's module that imports, naming what is not a declared plugin of the key's kind.
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:make_env", {"path": "{w.user}"})),
        "inputs.plug_user.make_env " + UNDECLARED,
    ),
    ("rl", with_module("plug_user", *env("inputs.plug_user:make_dict")), "inputs.plug_user.make_dict " + UNDECLARED),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:make_int")),
        "orchestrator.env[0] id 'inputs.plug_user:make_int': inputs.plug_user:make_int returns int, not an Environment",
    ),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:a_loss")),
        "inputs.plug_user.a_loss is declared a lorarl loss plugin",
    ),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:NotAnEnvironment")),
        "inputs.plug_user.NotAnEnvironment " + UNDECLARED,
    ),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:INSTANCE")),
        "inputs.plug_user.CallableThing object " + UNDECLARED,
    ),
    ("rl", with_module("plug_user", *env("inputs.plug_user:LAMBDA")), "inputs.plug_user.<lambda> " + UNDECLARED),
    ("rl", with_module("plug_user", *env("inputs.plug_user:PARTIAL")), "functools.partial object " + UNDECLARED),
    ("rl", with_module("plug_user", *env("inputs.plug_user:AN_ENV")), "reverse_text.ReverseText object " + UNDECLARED),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:nope")),
        "module 'inputs.plug_user' has no attribute 'nope'",
    ),
    (
        "rl",
        with_module("plug_user", *loss("inputs.plug_user:an_advantage")),
        "inputs.plug_user.an_advantage is declared a lorarl advantage plugin",
    ),
    (
        "rl",
        with_module("plug_user", *loss("inputs.plug_user:make_env")),
        "trainer.loss.fn 'inputs.plug_user:make_env'",
    ),
    (
        "rl",
        with_module("plug_user", *advantage("inputs.plug_user:undeclared_advantage")),
        "inputs.plug_user.undeclared_advantage " + UNDECLARED,
    ),
    ("rl", with_module("plug_user", *advantage("inputs.plug_user:a_loss")), "is declared a lorarl loss plugin"),
    (
        "rl",
        with_module("plug_user", *advantage("inputs.plug_user:CallableThing")),
        "inputs.plug_user.CallableThing " + UNDECLARED,
    ),
    (
        "rl",
        rl_args(*loss("no_such_plugins_module:my_loss")),
        "trainer.loss.fn 'no_such_plugins_module:my_loss': No module named",
    ),
    # Env args against the factory's signature and annotations: the arg named, nothing built.
    (
        "rl",
        rl_args(*env("reverse_text", {"min_words": "three"})),
        "orchestrator.env[0].args.min_words = 'three': ReverseText takes min_words: int",
    ),
    (
        "rl",
        rl_args(*env("reverse_text", {"words": [1, 2]})),
        "orchestrator.env[0].args.words = [1, 2]: ReverseText takes words: list[str] | None",
    ),
    ("rl", rl_args(*env("math", {"kinds": "add"})), "orchestrator.env[0].args.kinds = 'add'"),
    (
        "rl",
        rl_args(*env("calculator", {"terms": 2.5})),
        "orchestrator.env[0].args.terms = 2.5: Calculator takes terms: int",
    ),
    ("rl", rl_args(*env("search", {"top_k": None})), "orchestrator.env[0].args.top_k = None"),
    (
        "rl",
        rl_args(*env("unscramble", {"reward_mode": 1})),
        "orchestrator.env[0].args.reward_mode = 1: Unscramble takes reward_mode: str",
    ),
    ("rl", rl_args(*env("alphabet_sort", {"max_turns": [3]})), "orchestrator.env[0].args.max_turns = [3]"),
    (
        "rl",
        rl_args(*env("alphabet_sort", {"min_name_per_turn": 1})),
        "orchestrator.env[0].args do not fit AlphabetSort: got an unexpected keyword argument 'min_name_per_turn'",
    ),
    ("rl", rl_args(*env("math", {"max": 3})), "got an unexpected keyword argument 'max'"),
    (
        "rl",
        rl_args(*env("examples.custom_environment.my_env:CountLetter", {"max_attempts": "two"})),
        "args.max_attempts = 'two': CountLetter takes max_attempts: int",
    ),
    (
        "rl",
        rl_args(*env("examples.custom_environment.my_env:CountLetter", {"attempts": 2})),
        "unexpected keyword argument 'attempts'",
    ),
    (
        "rl",
        rl_args(*env("tests.integration.straggler_env:StragglerReverseText", {"max_words": {"n": 2}})),
        "args.max_words = {'n': 2}",
    ),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:sized")),
        "orchestrator.env[0].args do not fit sized: missing a required argument: 'size'",
    ),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:sized", {"size": "big"})),
        "args.size = 'big': sized takes size: int",
    ),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:sized", {"size": 2, "words": "ab"})),
        "args.words = 'ab': sized takes words: list[str] | None",
    ),
    (
        "rl",
        with_module("plug_user", *env("inputs.plug_user:sized", {"size": 2, "path": "{w.user}"})),
        "unexpected keyword argument 'path'",
    ),
]


@pytest.fixture(autouse=True)
def no_bytecode_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    importlib.invalidate_caches()  # modules written a moment ago are seen


@pytest.mark.parametrize(("command", "args", "names"), CASES, ids=case_ids(CASES))
def test_a_plugin_that_is_not_declared_or_does_not_fit_is_refused_unrun(
    ws: Workspace, capsys: pytest.CaptureFixture[str], command: str, args: Callable[[Workspace], list[str]], names: str
) -> None:
    argv = args(ws)
    assert_refused(ws, capsys, command, argv, names)
    assert not list(ws.root.glob("called-*"))  # no user function ran (assert_refused sees all the rest)


@pytest.mark.slow
def test_the_installed_rl_refuses_an_undeclared_plugin_and_never_calls_it(ws: Workspace) -> None:
    """Through the console script, as a user runs it from their own folder: with --dry-run and
    without (a real start makes the same checks first), `shutil:rmtree` of the user's folder is refused
    in one line and the folder stays."""
    rl = Path(sys.executable).parent / "rl"
    dry = rl_args(*env("shutil:rmtree", {"path": "{w.user}"}))(ws)
    for argv in (dry, [a for a in dry if a != "--dry-run"]):
        before = ws.snapshot()
        result = subprocess.run([str(rl), *argv], capture_output=True, text=True, cwd=ws.user)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            "error: orchestrator.env[0] id 'shutil:rmtree': not an Environment class, and shutil.rmtree is not "
            'declared a lorarl environment plugin: mark the function you mean with @lorarl.plugin("environment") '
            "or annotate its return type as an Environment"
        ]
        assert ws.snapshot() == before and (ws.user / "chapter1.tex").read_text() == "precious"

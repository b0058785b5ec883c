"""User functions that a config names as "package.module:function" (an environment factory, a custom
loss, an advantage estimator): one place that imports them and says, naming the key, why one cannot
be used.

A config names code to run, so lorarl runs only code its author declared for that use: a function
marked with `@lorarl.plugin(kind)` (or, for environments, an `Environment` subclass or a function
annotated to return one, see `orchestrator.envs.resolve_environment`). Anything else an import
reaches (`shutil:rmtree`, `subprocess:run`, `os:system`) is refused before it is ever called:
importing the named module is the only user code that runs before a check passes. A module that
fails to import is reported in one line naming the file, line and error, not a traceback.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sysconfig
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, TypeVar, get_args

from pydantic import ConfigDict, PydanticSchemaGenerationError, PydanticUserError, TypeAdapter, ValidationError

PluginKind = Literal["environment", "loss", "advantage"]
KINDS: tuple[str, ...] = get_args(PluginKind)
_MARK = "__lorarl_plugin__"  # the attribute `plugin` sets on a declared function
F = TypeVar("F", bound=Callable[..., Any])
# Where the interpreter's and installed libraries' code lives: a failing import is reported at the
# innermost line outside these (the user's own), where there is one.
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
# Annotations of any class are checked by isinstance (pydantic knows no schema for most of them).
_ANY_TYPE = ConfigDict(arbitrary_types_allowed=True)


class PluginError(ValueError):
    """The function a key names cannot be imported or used; str() is one line naming the key."""


class ArgsError(ValueError):
    """`args` that do not fit the function; str() is one line that starts with "args" and names the arg."""


def plugin(kind: PluginKind) -> Callable[[F], F]:
    """Declare the decorated function a lorarl plugin of `kind`, which config keys may then name:
    "environment" (`[[orchestrator.env]] id`, a factory returning an Environment), "loss"
    (`trainer.loss.fn` with type "custom") or "advantage" (`orchestrator.advantage.fn`, likewise)."""
    if kind not in KINDS:
        raise ValueError(f"plugin kind {kind!r}: give one of {', '.join(KINDS)}")

    def mark(fn: F) -> F:
        if not inspect.isfunction(fn):
            raise TypeError(f"@lorarl.plugin({kind!r}) marks functions, not a {type(fn).__name__}")
        setattr(fn, _MARK, kind)
        return fn

    return mark


def declared_kind(obj: object) -> str | None:
    """The kind `obj` was declared with by `plugin`, or None."""
    kind = getattr(obj, _MARK, None) if inspect.isfunction(obj) else None
    return kind if isinstance(kind, str) else None


def how_to_declare(obj: object, kind: PluginKind, alternative: str = "") -> str:
    """Why `obj` is not a `kind` plugin and what declares one (`plugin`, or `alternative`), for a
    refusal's line."""
    other = declared_kind(obj)
    why = f"is declared a lorarl {other} plugin" if other else f"is not declared a lorarl {kind} plugin"
    return f'{_named(obj)} {why}: mark the function you mean with @lorarl.plugin("{kind}"){alternative}'


def _named(obj: object) -> str:
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    return f"{_named(type(obj))} object"  # a callable instance, a functools.partial, ...


def import_user_module(name: str) -> ModuleType:
    """The module `name`, imported; if its code fails (or it is missing), a PluginError in one line
    naming the file, line and error."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise PluginError(str(e)) from None  # the module itself is not there
        raise PluginError(_import_failure(name, e)) from None
    except (Exception, SystemExit) as e:  # its top-level code may raise anything, or call sys.exit
        raise PluginError(_import_failure(name, e)) from None


def _import_failure(name: str, e: BaseException) -> str:
    what = f"{type(e).__name__}: {e.msg if isinstance(e, SyntaxError) else e}"
    if isinstance(e, SyntaxError) and e.filename:
        return f"cannot import {name}: {e.filename}:{e.lineno}: {what}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename not in (__file__, importlib.__file__)]
    frames = [f for f in frames if not f.filename.startswith("<")]  # importlib's own (frozen) frames
    users = [f for f in frames if not f.filename.startswith(_LIBRARY_DIRS)]
    at = (users or frames)[-1:]
    return f"cannot import {name}: " + "".join(f"{f.filename}:{f.lineno}: " for f in at) + what


def import_attribute(spec: str) -> object:
    """What "package.module:name" names, its module imported but nothing in it called."""
    module_name, name = spec.split(":", 1)
    module = import_user_module(module_name)
    try:
        return getattr(module, name)
    except AttributeError as e:
        raise PluginError(str(e)) from None


def load_function(spec: str, key: str, kind: PluginKind) -> Callable[..., Any]:
    """The function "package.module:function" (`spec`, given as config key `key`) names, which must
    be declared a `kind` plugin (see `plugin`); imported, never called here."""
    try:
        fn = import_attribute(spec)
    except PluginError as e:
        raise PluginError(f"{key} {spec!r}: {e}") from None
    if not callable(fn):
        raise PluginError(f"{key} {spec!r} is a {type(fn).__name__}, not a function")
    if declared_kind(fn) != kind:
        raise PluginError(f"{key} {spec!r}: {how_to_declare(fn, kind)}")
    if kind != "environment" and (inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn)):
        # Called each step for its result: a coroutine or a generator would be taken for one.
        what = "an async function" if inspect.iscoroutinefunction(fn) else "a generator function"
        raise PluginError(f"{key} {spec!r} is {what}: lorarl calls it for its result each step; make it a plain def")
    return fn


def fit_args(factory: Callable[..., Any], args: dict[str, Any], leading: int = 0) -> dict[str, Any]:
    """`args`, the keyword arguments a config gives a user's function, checked against its signature and
    parameter annotations (by pydantic, as `pydantic.validate_call` would, without calling it) and
    converted to the annotated types. `leading`: positional arguments lorarl passes before them (a loss
    function's inputs, an estimator's rewards and episodes)."""
    name = getattr(factory, "__name__", repr(factory))
    signature = _signature(factory)
    if signature is None:  # no signature to read (a C function): checked when built
        return args
    try:
        signature.bind(*[None] * leading, **args)
    except TypeError as e:
        raise ArgsError(f"args do not fit {name}: {e}") from None
    params = signature.parameters
    rest = next((p for p in params.values() if p.kind is p.VAR_KEYWORD), None)
    fitted = {}
    for arg, value in args.items():
        param = params[arg] if arg in params and params[arg].kind is not params[arg].VAR_POSITIONAL else rest
        hint = param.annotation if param is not None else inspect.Parameter.empty
        if hint is inspect.Parameter.empty or isinstance(hint, str):  # none, or one that did not resolve
            fitted[arg] = value
        else:
            where = f"args.{arg} = {value!r}: {name} takes {arg}: {inspect.formatannotation(hint)}"
            fitted[arg] = _fit(hint, value, where)
    return fitted


def _signature(factory: Callable[..., Any]) -> inspect.Signature | None:
    """The factory's signature with its annotations evaluated (left as strings where they do not
    resolve here: those args are checked by name alone), or None if it has none."""
    try:
        return inspect.signature(factory, eval_str=True)
    except (ValueError, TypeError):
        return None
    except Exception:  # an annotation that does not resolve here (a NameError, ...)
        return inspect.signature(factory)


def _fit(hint: Any, value: Any, where: str) -> Any:
    try:
        adapter = TypeAdapter(hint, config=_ANY_TYPE)
    except PydanticUserError:  # a model, dataclass or TypedDict: it has a config of its own
        adapter = TypeAdapter(hint)
    except PydanticSchemaGenerationError:  # a type pydantic cannot check: left to the factory
        return value
    try:
        fitted = adapter.validate_python(value)
    except ValidationError as e:
        raise ArgsError(f"{where} ({e.errors()[0]['msg']})") from None
    # pydantic's lax mode makes true a 1 and lets NaN through: neither is a number a user means.
    if isinstance(value, bool) and not isinstance(fitted, bool):
        raise ArgsError(f"{where} (true or false is not a number: write the number)")
    if isinstance(fitted, float) and math.isnan(fitted):
        raise ArgsError(f"{where} (NaN is not a number to compute with)")
    return fitted

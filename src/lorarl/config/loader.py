"""Build a validated config from `@ file` arguments and dotted command-line flags.

    rl @ configs/base.toml @ configs/small.json --trainer.optim.lr 1e-4 --dry-run

* `@ path` or `@path`: a TOML or JSON config file. Files are deep-merged left to right (tables merge
  key by key, lists replace) wherever they appear in argv.
* Flags, parsed by pydantic-settings, always override files, which override the class defaults:
  - values: `--trainer.optim.lr 1e-4` or `--trainer.optim.lr=1e-4`; `--model.name null` gives None.
  - booleans: `--orchestrator.advantage.std_normalize` / `--no-orchestrator.advantage.std_normalize`, or
    with `true` / `false` after the flag (any case, as TOML, JSON and Python spell them).
    Field names keep their underscores; top-level fields also take dashes (`--dry-run`, `--no-dry-run`).
  - lists: JSON (`--inference.urls '["http://a","http://b"]'`), comma-separated (`--inference.urls a,b`)
    or repeated (`--inference.urls a --inference.urls b`). A value that starts with `-` needs `=`:
    `--inference.extra_args=--enforce-eager`. Lists of sections take JSON:
    `--orchestrator.env '[{"id": "x"}]'`. A key that takes a string or a list (model.lora.target_modules)
    keeps a value that starts with `[` and is no list as the string typed: the regex `'[qk]_proj'`.
* `--help` prints every flag with its description (the field's docstring) and default, and exits 0.

Environment variables are never read. Any problem raises `ConfigError`, whose message names the key and
where its value came from (a file, "command line" or "default").
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, CliSettingsSource
from pydantic_settings.exceptions import SettingsError

from lorarl.config.common import WRONG_KIND
from lorarl.file_kinds import NOT_REGULAR, special_file

T = TypeVar("T", bound=BaseModel)
M = TypeVar("M", bound=BaseModel)
Loc = tuple[int | str, ...]
# (name, data) of each source of values, lowest precedence first: "default", files, "command line".
Layers = list[tuple[str, dict[str, Any]]]

_DEFAULT = "default"
_COMMAND_LINE = "command line"
_HELP = (
    "Config files: @ a.toml @ b.json (deep-merged left to right). Flags override files; booleans: --flag / --no-flag."
)


class ConfigError(Exception):
    """A config that cannot be loaded; str() is the message for the user."""


def load_config(cls: type[T], argv: list[str] | None = None) -> T:
    """Load `cls` from `argv` (default `sys.argv[1:]`): class defaults < `@ files` < flags."""
    return _load(cls, None, argv)[0]


def load_run(cls: type[T], mode_cls: type[M], argv: list[str] | None = None) -> tuple[T, M]:
    """Load the experiment `cls` and the run-mode flags `mode_cls` (config/run.py's RunMode: --dry-run,
    --overwrite, ...) from the same `argv`, as `load_config` does; the flags' keys go to the mode alone."""
    cfg, mode = _load(cls, mode_cls, argv)
    assert mode is not None
    return cfg, mode


def _load(cls: type[T], mode_cls: type[M] | None, argv: list[str] | None) -> tuple[T, M | None]:
    files, flags = _split_files(sys.argv[1:] if argv is None else argv)
    # Flags first, so that `--help` works whatever the files hold.
    from_cli = _parse_flags(cls if mode_cls is None else _both(cls, mode_cls), flags)
    layers: Layers = [
        (_DEFAULT, _defaults(cls)),
        *((f, _read_file(f)) for f in files),
        (_COMMAND_LINE, from_cli),
    ]
    merged: dict[str, Any] = {}
    for _, data in layers:
        merged = _merge(merged, data)
    if found := _lone_surrogate(merged):
        loc, value = found
        raise ConfigError(
            f"{'.'.join(map(str, loc))}: {value!r} holds a lone surrogate, which is not text (a broken \\u escape "
            f"or bytes that are not UTF-8) and no tokenizer or request can carry (from {_origin(loc, merged, layers)})"
        )
    mode_keys = set(mode_cls.model_fields) if mode_cls is not None else set()
    problems, cfg, mode = [], None, None
    try:
        cfg = cls.model_validate({k: v for k, v in merged.items() if k not in mode_keys})
    except ValidationError as e:
        problems.append(_describe(e, merged, layers, cls))
    if mode_cls is not None:
        try:
            mode = mode_cls.model_validate({k: v for k, v in merged.items() if k in mode_keys})
        except ValidationError as e:
            problems.append(_describe(e, merged, layers, mode_cls))
    if problems:
        raise ConfigError("\n".join(problems))
    assert cfg is not None
    return cfg, mode


def _lone_surrogate(data: Any, loc: Loc = ()) -> tuple[Loc, str] | None:
    """The key and value of the first string in `data` with a lone surrogate (JSON's "\\ud800", or an
    argument's bytes that are not UTF-8): valid in a Python str, it is accepted and then fails where the
    text is encoded, in a tokenizer or a request, as a traceback at start."""
    if isinstance(data, str):
        try:
            data.encode()
        except UnicodeEncodeError:
            return loc, data
        return None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if (found := _lone_surrogate(value, (*loc, key))) is not None:
            return found
    return None


def _both(cls: type[BaseModel], mode_cls: type[BaseModel]) -> type[BaseModel]:
    """One class with the fields of both, for the command line's parser and `--help`."""

    class Both(cls, mode_cls):  # type: ignore[misc, valid-type]
        __doc__ = cls.__doc__

    return Both


def _split_files(argv: list[str]) -> tuple[list[str], list[str]]:
    files: list[str] = []
    flags: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token == "@":
            path = next(tokens, None)
            if path is None:
                raise ConfigError("expected a config file after '@'")
            files.append(path)
        elif token.startswith("@"):
            files.append(token[1:])
        else:
            flags.append(token)
    return files, flags


def _parse_flags(cls: type[BaseModel], flags: list[str]) -> dict[str, Any]:
    """Flags as a nested dict of the keys they set, validated later together with the files."""

    # CliSettingsSource needs a BaseSettings class; only its parser is used, never its env/init sources.
    class Settings(BaseSettings, cls):  # type: ignore[misc, valid-type]
        __doc__ = _HELP

    flags, taken = _take_values(cls, flags)
    try:
        source = CliSettingsSource[Any](
            Settings,
            cli_prog_name=os.path.basename(sys.argv[0]),
            cli_parse_args=flags,
            cli_exit_on_error=False,
            cli_implicit_flags=True,
            cli_hide_none_type=True,
            cli_shortcuts={name: name.replace("_", "-") for name in cls.model_fields if "_" in name},
        )
        parsed = _null_lists(source())
    except SettingsError as e:
        if bad := _invalid_json(flags):
            raise ConfigError(bad) from None
        raise ConfigError(f"{_COMMAND_LINE}: {str(e).removeprefix('error parsing CLI: ')}") from None
    for path, value in taken:
        _put(parsed, path, value)
    return parsed


def _flag_values(flags: list[str]) -> list[tuple[int, str, str]]:
    """(index of the value, flag name without dashes, value) of each `--key value` or `--key=value`."""
    found = []
    for i, flag in enumerate(flags):
        if not flag.startswith("--"):
            continue
        name, eq, value = flag[2:].partition("=")
        if eq:
            found.append((i, name, value))
        elif i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            found.append((i + 1, name, flags[i + 1]))
    return found


def _take_values(cls: type[BaseModel], flags: list[str]) -> tuple[list[str], list[tuple[list[str], Any]]]:
    """`flags` with each value that pydantic-settings would misread (`_read_here`) replaced by an empty
    value of its kind (a true or false left out: the flag alone is one), and those values read here, by
    key path. The flag stays for pydantic-settings to check its key."""
    kept_flags: list[str | None] = list(flags)
    taken = []
    values = _flag_values(flags)
    for i, name, value in values:
        path = name.replace("-", "_").split(".")  # --dry-run: the shortcut of dry_run
        field = _field(cls, path)
        if _takes_bool(field) and value.lower() not in ("true", "false"):
            raise ConfigError(f"--{name} {value}: {name} takes true or false, or no value (--{name}, --no-{name})")
        if (read := _read_here(value, field)) is None:
            continue
        kept, what = read
        if sum(n == name for _, n, _ in values) > 1:  # the parts' order would be lost
            raise ConfigError(f"--{name}: given more than once, once as {what}: give it once, as one value")
        if isinstance(kept, bool):
            kept_flags[i] = f"--{name}" if flags[i].startswith("--") else None
        else:
            empty = "{}" if isinstance(kept, dict) else "[]"
            kept_flags[i] = f"--{name}={empty}" if flags[i].startswith("--") else empty
        taken.append((path, kept))
    return [f for f in kept_flags if f is not None], taken


def _read_here(value: str, annotation: Any) -> tuple[Any, str] | None:
    """The value a flag of a field of type `annotation` means, and what it is (for a message), where
    pydantic-settings would misread it; None elsewhere (or for no field: pydantic-settings names it).
    * A JSON list or object with a backslash: pydantic-settings doubles every backslash of a list value
      before decoding it, so an escaped quote (`["a\\"b"]`) became "error parsing value for field", and
      an escaped backslash two backslashes, silently.
    * A string that starts with "[" and is neither JSON nor a list `[a, b]`, for a key that takes a
      string or a list (model.lora.target_modules): pydantic-settings took the regex `[qk]_proj` for a
      list and turned it into the string '[[qk],"_proj"]'. It is the string the user typed.
    * `true` or `false` (any case) for a key that takes true or false (`--trainer.packing false`):
      pydantic-settings' flags take no value (`--trainer.packing`, `--no-trainer.packing`) and refused
      it as "unrecognized arguments: false", not naming the key. The spelling of TOML, JSON and most
      other tools' command lines works here too."""
    if _takes_bool(annotation) and value.lower() in ("true", "false"):
        return value.lower() == "true", "true or false"
    if annotation is None or not value.lstrip().startswith(("[", "{")):
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        members = _members(annotation)
        takes_lists = any(typing.get_origin(t) is list for t in members)
        if str in members and takes_lists and value.startswith("[") and not _plain_list(value):
            return value, "a string that starts with '['"
        return None  # reported by _invalid_json, if pydantic-settings refuses it
    return (parsed, "JSON with a \\ escape") if "\\" in value else None


def _takes_bool(annotation: Any) -> bool:
    """Whether a field of type `annotation` takes true or false (and perhaps None) alone."""
    members = _members(annotation)
    return bool in members and set(members) <= {bool, type(None)}


def _plain_list(value: str) -> bool:
    """Whether `value` is a list as pydantic-settings reads one without quotes, `[a, b]`: brackets at both
    ends and none inside."""
    inside = value.strip()
    return inside.endswith("]") and not any(c in inside[1:-1] for c in "[]")


def _put(data: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        data = data.setdefault(part, {})
    data[path[-1]] = value


def _invalid_json(flags: list[str]) -> str | None:
    """The message for the first value that looks like JSON (a list or object) and is not, naming its
    flag: pydantic-settings says only "error parsing value for field <section>"."""
    for _, name, value in _flag_values(flags):
        if value.lstrip().startswith(("[", "{")):
            try:
                json.loads(value)
            except json.JSONDecodeError as e:
                return (
                    f"--{name}: {value!r} is not valid JSON ({e}); strings take double quotes, e.g. "
                    '\'[{"id": "reverse_text"}]\''
                )
    return None


def _null_lists(data: dict[str, Any]) -> dict[str, Any]:
    """`--trainer.gpu_ids null` unsets a list as `--model.name null` unsets a string: pydantic-settings
    reads it as the list [None]."""
    return {
        key: None if value == [None] else _null_lists(value) if isinstance(value, dict) else value
        for key, value in data.items()
    }


def _defaults(cls: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        section = field.annotation
        if isinstance(field.default, BaseModel) and _is_section(section):
            # A file that sets one key of a section with a non-trivial default (SFTConfig.optim has
            # lr=1e-3) updates that default instead of replacing it with the section's field defaults.
            out[name] = _dumped_defaults(field.default)
        elif field.is_required() and _is_section(section):
            # A required section starts empty, so an error names its missing key (model.name), not "model".
            out[name] = _defaults(section)  # type: ignore[arg-type]
    return out


def _is_section(annotation: Any) -> bool:
    """A section of one class; not a union of them chosen by `type` (config/algorithms.py), whose
    default must not lend keys to the type a file picks."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _dumped_defaults(section: BaseModel) -> dict[str, Any]:
    """`section`'s values, less those of its union-typed sections (`_is_section`)."""
    fields = type(section).model_fields
    return {
        name: _dumped_defaults(value) if isinstance(value, BaseModel) else section.model_dump(include={name})[name]
        for name, value in section
        if not (isinstance(value, BaseModel) and not _is_section(fields[name].annotation))
    }


def _read_file(path: str) -> dict[str, Any]:
    suffix = Path(path).suffix
    if suffix not in (".toml", ".json"):
        raise ConfigError(f"{path}: config files must end in .toml or .json")
    try:
        if special_file(path):
            raise ConfigError(f"{path}: {NOT_REGULAR}: give a .toml or .json file")
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if text.startswith("\ufeff"):
        raise ConfigError(f"{path}: starts with a byte-order mark (BOM): save it as UTF-8 without one")
    try:
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: invalid {suffix[1:].upper()}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read (arrays or tables within each other)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table of config sections")
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = _merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _walk(data: Any, loc: Loc) -> tuple[Loc, Any]:
    """The longest prefix of `loc` present in `data`, and the value there."""
    for depth, key in enumerate(loc):
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return loc[:depth], data
    return loc, data


def _origin(loc: Loc, merged: dict[str, Any], layers: Layers) -> str:
    # Union errors add member names ("list[str]") to `loc`: attribute the part that is really in the input.
    path, _ = _walk(merged, loc)
    names: list[str] = []
    for name, data in layers:
        found, value = _walk(data, path)
        if found == path:
            # A section collects keys from every layer; a plain value comes from the last one that set it.
            names = [*names, name] if isinstance(value, dict) else [name]
    return ", ".join(names)


def _describe(error: ValidationError, merged: dict[str, Any], layers: Layers, cls: type[BaseModel]) -> str:
    """One line per problem, each naming the key and where its value came from."""
    lines = []
    errors, unions = _union_members(error.errors(), merged)
    for path, members in unions.items():
        key = ".".join(str(part) for part in user_key(cls, path)[0])
        said = "; ".join(f"{'.'.join(map(str, err['loc'][len(path) :]))}: {err['msg']}" for err in members)
        value = json.dumps(_walk(merged, path)[1], default=str)
        lines.append(f"{key} = {value}: none of the kinds it takes ({said}) (from {_origin(path, merged, layers)})")
    for err in errors:
        key, msg = key_and_message(cls, err)
        if err["type"] == "missing" and isinstance(err["loc"][-1], int):  # an item of a fixed-length list
            whole, where = key.rpartition(".")[0], _origin(err["loc"][:-1], merged, layers)
            lines.append(f"{whole}: too few values (item {err['loc'][-1]} is missing) (from {where})")
        elif err["type"] == "missing":
            lines.append(f"{key}: required, set it in a config file or with --{key}")
        elif not key and err["type"] != WRONG_KIND:  # a check across keys: its message names them
            lines.append(msg)
        else:  # a top-level key's kind (sft's packing): its message names it
            section = f"{key}: " if key else ""
            lines.append(f"{section}{msg} (from {_origin(_value_loc(err), merged, layers)})")
    return "\n".join(lines)


def _union_members(
    errors: list[ErrorDetails], merged: dict[str, Any]
) -> tuple[list[ErrorDetails], dict[Loc, list[ErrorDetails]]]:
    """`errors` apart from those of a value that fits no member of its field's union, and those by the
    value's place: pydantic reports one per member, its name added to the place ("list[str]", "str"),
    which made a line each (`target_modules = 5`)."""
    rest: list[ErrorDetails] = []
    unions: dict[Loc, list[ErrorDetails]] = {}
    for err in errors:
        path, value = _walk(merged, err["loc"])
        # A member's error is about the value at the place itself, which is the input it was given.
        if (
            err["type"] not in ("missing", WRONG_KIND)
            and path
            and len(path) < len(err["loc"])
            and err["input"] == value
        ):
            unions.setdefault(path, []).append(err)
        else:
            rest.append(err)
    for path in [p for p, members in unions.items() if len(members) == 1]:  # no union: a key the input lacks
        rest.extend(unions.pop(path))
    return rest, unions


def _value_loc(err: ErrorDetails) -> Loc:
    """Where the value at fault is: a section's check of its values' kinds (config/common.py) is reported
    at the section, which every layer may set keys of, and names its key, which one layer set."""
    if err["type"] == WRONG_KIND and "ctx" in err:
        return (*err["loc"], err["ctx"]["key"])
    return err["loc"]


def key_and_message(cls: Any, err: ErrorDetails) -> tuple[str, str]:
    """The dotted key a validation error of `cls` (a section class, or a union of them) is about, as the
    user writes it, and its message."""
    keys, tag = user_key(cls, err["loc"])
    unknown = f"unknown key of type {tag!r}" if tag else "unknown key"
    msg = unknown if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
    return ".".join(str(part) for part in keys), msg


def user_key(cls: Any, loc: Loc) -> tuple[Loc, str | None]:
    """`loc` as the user writes the key, without the tag pydantic adds where a section is chosen by
    `type` (config/algorithms.py: trainer.loss.ppo.nrom is the user's trainer.loss.nrom), and that tag."""
    keys, tag, _ = _walk_fields(cls, loc)
    return keys, tag


def _field(cls: type[BaseModel], path: list[str]) -> Any:
    """The annotation of the field that the dotted key `path` (as the user writes it) names in `cls`,
    through its sections, optional ones and those chosen by `type` included; None if it names none."""
    return _walk_fields(cls, tuple(path))[2]


def _walk_fields(cls: Any, loc: Loc) -> tuple[Loc, str | None, Any]:
    """`loc` without pydantic's tags (`user_key`), the last tag, and the annotation of the field it names
    (None where it names none). One walk for the locations of validation errors, which hold a tag where a
    section is chosen by `type`, and for the keys of flags, which as the user writes them do not."""
    out: list[int | str] = []
    annotation: Any = cls
    tag = None
    for part in loc:
        chosen = next((t for t in _members(annotation) if _tag(t) == part), None)
        if chosen is not None and _is_union_of_sections(annotation):
            annotation, tag = chosen, str(part)
            continue
        out.append(part)
        annotation = _below(annotation, part)
    return tuple(out), tag, annotation


def _below(annotation: Any, part: int | str) -> Any:
    """The annotation of `part` in a value of `annotation`: an item of a list, or a field of a section
    (of the first member of a union that has it, such as `LoraConfig | None`); None if there is none."""
    if isinstance(part, int):
        return typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
    sections = (t for t in _members(annotation) if isinstance(t, type) and issubclass(t, BaseModel))
    section = next((t for t in sections if part in t.model_fields), None)
    return section.model_fields[part].annotation if section is not None else None


def _members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union, or `annotation` alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is_union_of_sections(annotation: Any) -> bool:
    members = _members(annotation)
    return len(members) > 1 and all(_tag(t) is not None for t in members)


def _tag(section: Any) -> str | None:
    """The `type` a section class of a union stands for (config/algorithms.py), or None."""
    if isinstance(section, type) and issubclass(section, BaseModel) and "type" in section.model_fields:
        default = section.model_fields["type"].default
        return default if isinstance(default, str) else None
    return None


def json_object(file: Path, key: str) -> dict[str, Any]:
    """The JSON object in `file` (a file that config key `key` leads to); ValueError, one line naming
    both, if it cannot be read or holds something else."""
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{key}: {file} is not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{key}: {file} holds a {type(data).__name__}, not a JSON object")
    return data

"""Command-line flags, keyword arguments and `key=value` options generated from the config dataclasses.

The config tree (`ServerConfig` → `LoadConfig`, `EngineConfig` → `SpeculativeConfig`) is made of frozen
dataclasses whose fields carry their user-facing description in `option(...)` metadata: help text, the
flag's spelling where it is not the field name (`cache_memory_gib` → `--cache-memory`), short aliases,
choices, a metavar, an environment variable that stands in for a missing value. Everything else comes from
the field's type: `int` / `float` / `str` → a typed flag, `bool` → `--x/--no-x`, `Literal[…]` → choices,
`tuple[str, ...]` → `nargs="+"`. A field whose type is a config dataclass is a subtree; an optional subtree
(`speculative: SpeculativeConfig | None`) has one `switch` field whose flag turns it on (`--speculative
ngram`), and its other flags need that switch.

Three consumers, one walk over the fields (`leaves`):
- `add_flags(parser, cls)`: one flag per leaf field (argparse dest = the field's name);
- `build(cls, values)`: a mapping of leaf names (a field's name or its flag's spelling with underscores)
  → the config tree; missing names keep the dataclass default, an unknown name is a TypeError naming it;
- `from_args(cls, args)`: parsed flags → the config tree (only the leaves' dests are read).
So each default is written once, in its dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field
from typing import Any, TypeVar

from blazr.errors import BlazrError

T = TypeVar("T")
_KEY = "blazr_option"


def option(
    default: Any = MISSING,
    *,
    help: str,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    metavar: str | None = None,
    choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    parse: Callable[[str], Any] | None = None,
    env: str | None = None,
    switch: bool = False,
    requires: str | None = None,
    auto_is_none: bool = False,
) -> Any:
    """A dataclass field with its command-line description. `flag`: the long option (default `--` + the
    field name with dashes); `aliases`: more spellings (`-m`); `parse`: argparse's `type` (default from the
    annotation); `env`: read when the value is missing or None; `switch`: this field's flag turns its
    optional subtree on (None: the subtree is None); `requires`: the switch value this field needs
    (named in the error); `auto_is_none`: the flag spells None as "auto"."""
    meta = {
        _KEY: dict(
            help=help,
            flag=flag,
            aliases=aliases,
            metavar=metavar,
            choices=choices,
            parse=parse,
            env=env,
            switch=switch,
            requires=requires,
            auto_is_none=auto_is_none,
        )
    }
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One settable field of the tree: where it sits, its type and its flag."""

    path: tuple[str, ...]  # attribute path from the root, e.g. ("engine", "speculative", "method")
    field: Field
    hint: Any  # the resolved annotation
    owner: type

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def meta(self) -> dict[str, Any]:
        return self.field.metadata.get(_KEY, {})

    @property
    def flag(self) -> str:
        return self.meta.get("flag") or "--" + self.name.replace("_", "-")

    @property
    def keys(self) -> tuple[str, ...]:
        """The names `build` accepts for it: the field's name, and its flag's spelling with underscores."""
        alias = self.flag.lstrip("-").replace("-", "_")
        return (self.name,) if alias == self.name else (self.name, alias)

    @property
    def default(self) -> Any:
        f = self.field
        return f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]

    @property
    def base(self) -> Any:
        """The annotation without `| None`."""
        args = [a for a in typing.get_args(self.hint) if a is not type(None)]
        if _is_union(self.hint) and len(args) == 1:
            return args[0]
        return self.hint

    @property
    def is_bool(self) -> bool:
        return self.base is bool

    @property
    def choices(self) -> list[str] | None:
        choices = self.meta.get("choices")
        if callable(choices):
            choices = choices()
        if choices is None and typing.get_origin(self.base) is typing.Literal:
            choices = typing.get_args(self.base)
        if choices is None:
            return None
        return ["auto", *choices] if self.meta.get("auto_is_none") else list(choices)

    def coerce(self, text: str) -> Any:
        """A value written as text (`serve run key=value`) as the field's type."""
        if typing.get_origin(self.base) is tuple:
            return tuple(v for v in text.split(",") if v)
        if _is_union(self.hint) and text.lower() in ("", "none", "null"):
            return None
        if self.is_bool:
            return text.lower() in ("1", "true", "yes", "on")
        parse = self.meta.get("parse") or (self.base if self.base in (int, float) else None)
        try:
            return parse(text) if parse is not None else text
        except (argparse.ArgumentTypeError, ValueError) as e:
            raise ValueError(f"{self.name}={text}: {e}") from None


@dataclasses.dataclass(frozen=True)
class Subtree:
    """A field whose type is a config dataclass (`optional`: `X | None`, turned on by its switch)."""

    path: tuple[str, ...]
    field: Field
    cls: type
    optional: bool


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _subtree_class(hint: Any) -> tuple[type | None, bool]:
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]) and isinstance(args[0], type):
        return args[0], _is_union(hint)
    return None, False


def walk(cls: type, path: tuple[str, ...] = ()) -> Iterable[Leaf | Subtree]:
    """Every leaf and subtree of `cls`, depth first, in field order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub, optional = _subtree_class(hints[f.name])
        if sub is not None:
            yield Subtree((*path, f.name), f, sub, optional)
            yield from walk(sub, (*path, f.name))
        else:
            yield Leaf((*path, f.name), f, hints[f.name], cls)


def leaves(cls: type) -> list[Leaf]:
    """The settable fields of the tree under `cls`; their names are unique across it (a test checks)."""
    return [x for x in walk(cls) if isinstance(x, Leaf)]


# ------------------------------------------------------------------------------------------- argparse


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (a bad one is refused at parse time, with the usage line)."""
    return _number(text, int, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, "an integer ≥ 0")


def positive_float(text: str) -> float:
    value = _number(text, float, 0, "a number > 0")
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number > 0, got 0")
    return value


def seconds(text: str) -> float:
    return _number(text, float, 0, "a number of seconds ≥ 0")


def _number(text: str, kind: type, low: float, what: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not value >= low:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
    return value


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    title: str | None = None,
) -> None:
    """One flag per leaf of `cls` (or the leaves named in `only`), dest = the field's name, in an
    argument group per dataclass (titled by its docstring's first sentence, or `title`)."""
    wanted = set(only) if only is not None else None
    groups: dict[type, Any] = {}
    for leaf in leaves(cls):
        if wanted is not None and leaf.name not in wanted:
            continue
        if leaf.owner not in groups:
            heading = title if leaf.owner is cls and title else _title(leaf.owner)
            groups[leaf.owner] = parser.add_argument_group(heading)  # type: ignore[union-attr]
        _add(groups[leaf.owner], leaf)


def _title(cls: type) -> str:
    doc = (cls.__doc__ or cls.__name__).strip().split("\n")[0]
    return f"{cls.__name__}: {doc.split('. ')[0].rstrip('.:')}"


def _add(group: Any, leaf: Leaf) -> None:
    meta = leaf.meta
    help_text = meta.get("help", "").replace("%", "%%")
    kwargs: dict[str, Any] = {"dest": leaf.name, "help": help_text}
    default = leaf.default
    if meta.get("switch") or meta.get("env"):
        default = None
    elif meta.get("auto_is_none") and default is None:
        default = "auto"
    kwargs["default"] = default
    if default is not None and default != () and not meta.get("switch"):
        kwargs["help"] += " (default: %(default)s)"
    if leaf.is_bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        if typing.get_origin(leaf.base) is tuple:
            kwargs["nargs"] = "+"
            kwargs["default"] = None
        else:
            parse = meta.get("parse") or (leaf.base if leaf.base in (int, float) else None)
            if parse is not None:
                kwargs["type"] = parse
        if leaf.choices is not None:
            kwargs["choices"] = leaf.choices
        if meta.get("metavar") or leaf.base in (int, float):
            kwargs["metavar"] = meta.get("metavar") or {int: "N", float: "X"}[leaf.base]
    group.add_argument(leaf.flag, *meta.get("aliases", ()), **kwargs)


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Parsed flags (added by `add_flags`) → the config tree; a value the tree refuses is a BlazrError."""
    given = vars(args)
    values = {leaf.name: given[leaf.name] for leaf in leaves(cls) if leaf.name in given}
    try:
        return build(cls, values)
    except (TypeError, ValueError) as e:
        raise BlazrError(str(e)) from None


# ------------------------------------------------------------------------------------------ the build


def build(cls: type[T], values: Mapping[str, Any], base: T | None = None) -> T:
    """The tree under `cls` from leaf names → values (see the module docstring); a name not given keeps
    `base`'s value (default: the dataclass default). A subtree's own name may also carry a whole object
    (`engine=EngineConfig(...)`, `speculative=None`), which the leaves given by name then override. Unknown
    name → TypeError; a value a dataclass refuses → its ValueError."""
    pending = dict(values)
    tree = _build(cls, pending, (), base)
    if pending:
        known = sorted({k for leaf in leaves(cls) for k in leaf.keys} | _subtree_names(cls))
        raise TypeError(f"unknown option(s) {', '.join(sorted(pending))}; known: {', '.join(known)}")
    return tree


def _subtree_names(cls: type) -> set[str]:
    return {x.field.name for x in walk(cls) if isinstance(x, Subtree)}


def _take(leaf: Leaf, pending: dict[str, Any]) -> Any:
    found = [k for k in leaf.keys if k in pending]
    if len(found) > 1:
        raise TypeError(f"{' and '.join(found)} name the same option")
    value = pending.pop(found[0]) if found else MISSING
    meta = leaf.meta
    if meta.get("auto_is_none") and value == "auto":
        value = None
    if isinstance(value, list):
        value = tuple(value)
    if value is None and not _is_union(leaf.hint):  # a flag left unset (nargs="+", a switch): the default
        value = MISSING
    if meta.get("env") and (value is MISSING or value is None):
        value = os.environ.get(meta["env"]) or MISSING
    return value


def _build(cls: type, pending: dict[str, Any], path: tuple[str, ...], base: Any = None) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        sub, optional = _subtree_class(hints[f.name])
        below = getattr(base, f.name) if base is not None else None
        if sub is None:
            value = _take(Leaf((*path, f.name), f, hints[f.name], cls), pending)
            if value is not MISSING:
                kwargs[f.name] = value
            elif base is not None:
                kwargs[f.name] = below
            continue
        whole = pending.get(f.name, MISSING)
        if whole is None:
            kwargs[f.name] = pending.pop(f.name)
        elif isinstance(whole, sub):  # a whole object: the base that its leaves given by name override
            kwargs[f.name] = _build(sub, pending, (*path, f.name), pending.pop(f.name))
        elif optional:
            kwargs[f.name] = _build_optional(sub, pending, (*path, f.name), below)
        else:
            kwargs[f.name] = _build(sub, pending, (*path, f.name), below)
    return cls(**kwargs)


def _build_optional(cls: type, pending: dict[str, Any], path: tuple[str, ...], base: Any) -> Any:
    """An optional subtree: built when its switch has a value (or `base` has the subtree), else None —
    and then none of its other options may differ from their defaults."""
    subleaves = [x for x in walk(cls, path) if isinstance(x, Leaf) and len(x.path) == len(path) + 1]
    switch = next(leaf for leaf in subleaves if leaf.meta.get("switch"))
    keys = {k for leaf in subleaves for k in leaf.keys}
    if _peek(switch, pending) is None and base is None:
        for leaf in subleaves:
            value = _take(leaf, pending)
            if leaf is not switch and value is not MISSING and value != leaf.default:
                needs = f"{switch.flag} {leaf.meta['requires']}" if leaf.meta.get("requires") else switch.flag
                raise ValueError(f"{leaf.flag} needs {needs}")
        return None
    mine = {k: pending.pop(k) for k in list(pending) if k in keys}
    if _peek(switch, mine) is None:  # the switch not given (or given as None): base's subtree
        for k in switch.keys:
            mine.pop(k, None)
    return _build(cls, mine, path, base)


def _peek(leaf: Leaf, pending: Mapping[str, Any]) -> Any:
    for k in leaf.keys:
        if k in pending:
            return pending[k]
    return None

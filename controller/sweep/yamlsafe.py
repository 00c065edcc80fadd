"""YAML for sweep files: libyaml's parser, safe constructors that never raise a bare Python
error, and a tree bounded in depth and in size (aliases expanded) before anything is built.

Every failure is a `yaml.MarkedYAMLError` with the line and column of the node at fault,
so `controller.sweep.load` has one way to report it. `line_of` finds the line of a field
path (`strategies[1].params.p`) in the composed tree, for the validation errors.

A spec that arrives as data (a request's JSON, a stored spec.json) is held to the same depth by
`data_fault`, which also refuses text that is not valid Unicode (JSON's "\\ud800" is a lone surrogate;
YAML refuses such an escape itself): `unicode_fault` is the one test of that, prompt files' too.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from worker.core.errors import short

# libyaml (PyYAML's C extension) parses a 1 MB file about ten times faster than the pure
# Python parser, and stops at 1000 levels of nesting itself.
_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_DEPTH = 64  # levels of nesting, aliases followed
MAX_ALIASES = 1000  # alias references (`*name`) to lists or mappings in one file
MAX_NODES = 1_000_000  # nodes of the tree with every alias expanded (a "billion laughs" stops here)

_TAG = "tag:yaml.org,2002:"
_WHAT = {"int": "an integer", "float": "a number", "bool": "true or false", "timestamp": "a valid date or time"}


class _Loader(_Base):  # type: ignore[misc, valid-type]
    """The safe loader whose scalar constructors turn Python's errors into YAML errors, and that refuses a
    key written twice in one mapping (YAML and JSON readers keep the last one, silently)."""

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _TAG + "merge":  # `<<: *base`: the keys written beside it override its keys
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the base constructor says so
                    continue
                if first is not key_node:
                    raise ConstructorError(
                        None,
                        None,
                        f"the key {short(key)} is given twice (first on line {first.start_mark.line + 1})",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


def _total(tag: str, construct: Any) -> Any:
    def constructor(loader: SafeConstructor, node: ScalarNode) -> Any:
        # Each of these is what one of PyYAML's constructors raises on a malformed scalar:
        # int('0x', 16) ValueError, '' [0] IndexError, bool_values['maybe'] KeyError,
        # a timestamp regex that does not match AttributeError, a huge exponent OverflowError.
        try:
            value = construct(loader, node)
        except (ValueError, IndexError, KeyError, AttributeError, OverflowError):
            raise ConstructorError(
                None,
                None,
                f"{short(node.value)} is not {_WHAT[tag]} (quote it if it is meant as text)",
                node.start_mark,
            ) from None
        if tag == "timestamp" and not isinstance(value, datetime.date):  # pragma: no cover
            raise ConstructorError(None, None, f"{short(node.value)} is not {_WHAT[tag]}", node.start_mark)
        return value

    return constructor


# YAML 1.2 (and JSON) read `3e-4` as a number; PyYAML's YAML 1.1 rules want a dot (`3.0e-4`) and read it as the
# text "3e-4", which a strategy then refused as "must be a number, got '3e-4'": e-notation without a dot is a float.
_Loader.add_implicit_resolver(_TAG + "float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789"))

for _tag, _construct in (
    ("int", SafeConstructor.construct_yaml_int),
    ("float", SafeConstructor.construct_yaml_float),
    ("bool", SafeConstructor.construct_yaml_bool),
    ("timestamp", SafeConstructor.construct_yaml_timestamp),
):
    _Loader.add_constructor(_TAG + _tag, _total(_tag, _construct))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return node.value
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_tree(root: Node) -> None:
    """Refuse a tree deeper than MAX_DEPTH, with more than MAX_ALIASES aliases of lists or
    mappings, or larger than MAX_NODES once aliases are expanded; iterative, each node once."""
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    open_nodes: set[int] = set()
    aliases = 0
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            open_nodes.discard(key)
            kids = [k for k in _children(node) if not isinstance(k, ScalarNode)]
            n_scalars = len(_children(node)) - len(kids)
            size[key] = 1 + n_scalars + sum(size[id(k)] for k in kids)
            height[key] = 1 + max((height[id(k)] for k in kids), default=1 if n_scalars else 0)
            if height[key] > MAX_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", node.start_mark)
            if size[key] > MAX_NODES:
                raise ComposerError(
                    None, None, f"expands to more than {MAX_NODES:,} values (aliases counted)", node.start_mark
                )
            continue
        if key in open_nodes:
            raise ComposerError(None, None, "an alias refers to a node that contains it", node.start_mark)
        if key in size:  # a node met again: an alias of an anchor already read
            aliases += 1
            if aliases > MAX_ALIASES:
                raise ComposerError(None, None, f"more than {MAX_ALIASES} aliases", node.start_mark)
            continue
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in reversed(_children(node)) if not isinstance(kid, ScalarNode))


class DuplicateKey(ValueError):
    """A JSON object that names a key twice (json.loads would keep the last)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads's `object_pairs_hook` for what a client wrote (a JSONL prompt line, a request body): a key given
    twice is a DuplicateKey, as in a sweep file, not the last one kept in silence."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"the key {short(key, 40)} is given twice in one object")
        out[key] = value
    return out


def unicode_fault(text: str) -> str | None:
    """Why `text` is not valid Unicode (a lone surrogate, and where), None where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"a lone surrogate U+{ord(text[err.start]):04X} at character {err.start + 1}"
    return None


def data_fault(value: Any, level: int = 1) -> tuple[tuple[Any, ...], str] | None:
    """The path and the reason of the first place where plain data (JSON's: dicts, lists, scalars) breaks
    what a sweep file may hold: nested deeper than MAX_DEPTH levels, counted as `check_tree` counts them
    (`value` at `level`; a scalar is a level), or a key or a text that is not valid Unicode. Iterative,
    each value once."""
    stack: list[tuple[Any, int, tuple | None]] = [(value, level, None)]  # trail: (key, parent's trail)
    while stack:
        node, depth, trail = stack.pop()
        why = None
        if depth > MAX_DEPTH:
            why = f"nested deeper than {MAX_DEPTH} levels"
        elif isinstance(node, str) and (bad := unicode_fault(node)):
            why = f"not valid Unicode: {bad}"
        elif isinstance(node, dict):
            for key in node:
                if isinstance(key, str) and (bad := unicode_fault(key)):
                    why = f"a key is not valid Unicode: {bad}"
                    break
            else:
                stack.extend((v, depth + 1, (k, trail)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((node[i], depth + 1, (i, trail)) for i in range(len(node) - 1, -1, -1))
        if why:
            loc = []
            while trail is not None:
                loc.append(trail[0])
                trail = trail[1]
            return tuple(reversed(loc)), why
    return None


def load(text: str) -> tuple[Any, Node | None]:
    """The document of `text` and its composed node tree (None for an empty document)."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        check_tree(root)
        return loader.construct_document(root), root
    finally:
        loader.dispose()


def line_of(root: Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest node of `loc` found in the tree (None without a tree)."""
    node, line = root, None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        nxt = None
        if isinstance(node, SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            nxt = node.value[part]
        elif isinstance(node, MappingNode):
            for k, v in node.value:
                if isinstance(k, ScalarNode) and k.value == str(part):
                    nxt = v
                    break
        node = nxt
    if node is not None:
        line = node.start_mark.line + 1
    return line

"""The one label of a strategy variant, for every view of a sweep: the report's tables (HTML, printed,
Markdown, the terminal's), its charts' legends, points and bars, the example cards, the paired comparisons
and ratings (through `controller.report.render.labels`, which reads a summary's rows), `run`'s progress bar,
`status --watch` (`key_labels`, from the cell keys) and the notebook API
(`controller.report.api.variant_labels`).

A variant is named by its strategy and the parameters that tell it apart from the strategy's other variants
in the sweep: a parameter shows where its value differs between them (or some lack it), and is left out where
every variant of the strategy has the same value, default or not (the spec, the provenance and the `params`
column say what it is). So a grid `top_p: {p: [0.8, 0.9, 0.95]}` gives `top_p(p=0.8)`, `top_p(p=0.9)`,
`top_p(p=0.95)`, and the quickstart's one `top_k(k=40,temperature=1.0)` is `top_k`. Samples follow
(`[samples=8]`), and in a sweep over several engines the engine (`@ vllm`). Two different variants never
share a label: they differ in some parameter's value, which then shows in both
(tests/unit/controller/report/render/test_labels.py).
Pure: no pandas, so that `status` and `run` load nothing more for it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from worker.core.engines import OWN_ENGINE

_NAME_AT = re.compile(r",(?=[A-Za-z_][A-Za-z0-9_]*=)")  # a cell key's parameter separator (values may hold commas)


class Variant(NamedTuple):
    """What a label is made of: the strategy, its parameters (name, value) in key order, the samples' suffix
    (`[samples=8]`) and the engine (empty for a sweep on one engine)."""

    strategy: str
    params: tuple[tuple[str, Any], ...] = ()
    samples: str = ""
    engine: str = ""


def _label(v: Variant, shown: set[str] | None = None) -> str:
    """`strategy(k=v,…)[samples] @ engine` with the parameters in `shown` (None: every one)."""
    params = [f"{k}={value}" for k, value in v.params if shown is None or k in shown]
    text = v.strategy + (f"({','.join(params)})" if params else "") + v.samples
    return f"{text} @ {v.engine}" if v.engine else text


def label_variants(variants: Sequence[Variant]) -> list[str]:
    """The label of each variant, given every variant of the sweep: its strategy's varying parameters."""
    values: dict[str, dict[str, set[str]]] = {}
    for v in variants:
        for k, value in v.params:
            values.setdefault(v.strategy, {}).setdefault(k, set()).add(repr(value))
    of_strategy: dict[str, list[Variant]] = {}
    for v in variants:
        of_strategy.setdefault(v.strategy, []).append(v)
    vary = {
        s: {k for k, seen in by_key.items() if len(seen) > 1 or any(k not in dict(v.params) for v in of_strategy[s])}
        for s, by_key in values.items()
    }
    return [_label(v, vary.get(v.strategy, set())) for v in variants]


def key_labels(cells: Sequence[str]) -> list[str]:
    """Cell keys (`model::strategy(a=1,b=2)[samples=8]`, `::engine` after another engine's) as labelled by the
    rule above, `model · variant` where the keys name several models (`status --watch`, which has no summary)."""
    parsed = []
    for cell in cells:
        model, _, rest = cell.partition("::")
        variant, _, engine = rest.partition("::")
        head, _, samples = variant.partition("[")
        name, _, inside = head.partition("(")
        pairs = [p.partition("=") for p in _NAME_AT.split(inside.removesuffix(")"))] if inside else []
        params = tuple((k, text) for k, _, text in pairs)
        parsed.append((model, Variant(name, params, f"[{samples}" if samples else "", engine)))
    if any(v.engine for _, v in parsed):  # the own engine's cells carry no engine in their key
        parsed = [(m, v if v.engine else v._replace(engine=OWN_ENGINE)) for m, v in parsed]
    labels = label_variants([v for _, v in parsed])
    several = len({m for m, _ in parsed}) > 1
    return [f"{m} · {label}" if several else label for (m, _), label in zip(parsed, labels)]

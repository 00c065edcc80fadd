"""The one word tokenizer of every reference-free text metric.

Every cell, the reference row included, is tokenised the same way, independent of
the model's own (subword) tokenizer, so that the text metrics of two models compare:

1. lowercase the text with Python's `str.lower()`;
2. take, left to right, every match of the regular expression

       \\w+(?:['’]\\w+)*|[^\\w\\s]

   (Python `re`, Unicode aware): a run of word characters (letters, digits,
   underscore), possibly joined by apostrophes (``don't``, ``o’clock`` stay one
   token), or any single character that is neither a word character nor white space
   (each punctuation mark or symbol is a token of its own: ``...`` is three tokens).

White space only separates tokens. Nothing else is normalised (no stemming, no
Unicode normalisation). BLEU and ROUGE are the exception: they keep their own standard
tokenisation (sacrebleu's 13a, rouge-score's) so that they compare with published
numbers; see docs/metrics.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

WORD_PATTERN = r"\w+(?:['’]\w+)*|[^\w\s]"
TOKENIZER_DESCRIPTION = f"lowercase, then re.findall({WORD_PATTERN!r})"

_WORD_RE = re.compile(WORD_PATTERN)


def word_tokenize(text: str) -> list[str]:
    """Split `text` into lowercase word and punctuation tokens (see the module docstring).

    >>> word_tokenize("Don't stop -- it's 3.5 km!")
    ["don't", 'stop', '-', '-', "it's", '3', '.', '5', 'km', '!']
    """
    return _WORD_RE.findall(text.lower())


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """All contiguous n-grams of `words`, in order; empty when `len(words) < n`.

    A sequence of L tokens has max(0, L - n + 1) n-grams. N-grams never cross the
    boundary between two generations: call this once per generation.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return list(zip(*(words[i:] for i in range(n))))

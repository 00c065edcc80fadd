"""The one word tokenizer of every reference-free text metric.

Every cell, the reference row included, is tokenised the same way, independent of
the model's own (subword) tokenizer, so that the text metrics of two models compare:

1. lowercase the text with Python's `str.lower()`;
2. take, left to right, every match of the regular expression `WORD_PATTERN`
   (the `regex` package, Unicode aware; `W` stands for a word character, one of
   `[\\w\\p{M}\\p{N}]` that is not CJK):

       [CJK] | W+(?:['’]W+)* | [^\\w\\p{M}\\p{N}\\s]

   - each CJK character (`\\p{scx=Han}`, `\\p{scx=Hiragana}`, `\\p{scx=Katakana}`: scripts written
     without spaces between words) is a token of its own, as BERT's tokenizer and sacrebleu's `zh`
     tokenizer split Chinese characters;
   - a run of word characters (letters, combining marks, digits, underscore; Unicode's word
     characters, so a vowel sign of Devanagari or Thai, a decomposed accent or a zero-width joiner
     stays inside its word), possibly joined by apostrophes (``don't``, ``o’clock`` stay one token);
   - any single character that is none of those nor white space (each punctuation mark or symbol
     is a token of its own: ``...`` is three tokens).

White space only separates tokens. Nothing else is normalised (no stemming, no
Unicode normalisation). BLEU and ROUGE are the exception: they keep their own standard
tokenisation (sacrebleu's 13a, rouge-score's) so that they compare with published
numbers; see docs/metrics.md.

Until 2026-12-08 the pattern was Python `re`'s `\\w+(?:['’]\\w+)*|[^\\w\\s]`, whose `\\w` has no
combining mark: ``हिन्दी`` was six tokens, four of them a lone vowel sign or virama, and a whole
Chinese or Japanese sentence one word.
"""

from __future__ import annotations

from collections.abc import Sequence

import regex

_CJK = r"\p{scx=Han}\p{scx=Hiragana}\p{scx=Katakana}"
_W = rf"[[\w\p{{M}}\p{{N}}]--[{_CJK}]]"
WORD_PATTERN = rf"(?V1)[{_CJK}]|{_W}+(?:['’]{_W}+)*|[^\w\p{{M}}\p{{N}}\s]"
TOKENIZER_DESCRIPTION = f"lowercase, then regex.findall({WORD_PATTERN!r})"

WORD_RE = regex.compile(WORD_PATTERN)


def word_tokenize(text: str) -> list[str]:
    """Split `text` into lowercase word and punctuation tokens (see the module docstring).

    >>> word_tokenize("Don't stop -- it's 3.5 km!")
    ["don't", 'stop', '-', '-', "it's", '3', '.', '5', 'km', '!']
    >>> word_tokenize("हिन्दी 北京")
    ['हिन्दी', '北', '京']
    """
    return WORD_RE.findall(text.lower())


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """All contiguous n-grams of `words`, in order; empty when `len(words) < n`.

    A sequence of L tokens has max(0, L - n + 1) n-grams. N-grams never cross the
    boundary between two generations: call this once per generation.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return list(zip(*(words[i:] for i in range(n))))

"""Jane Austen's novels from Debian's ``r-cran-janeaustenr``, read without R.

``fetch_novels`` downloads the package with ``apt-get download``, unpacks its R
lazy-load database and decodes it with ``RDeserializer`` (R's XDR serialization);
``clean_novel`` turns a novel's lines into paragraphs without headings. Used by
``train_models.py``.
"""

import gzip
import re
import struct
import subprocess
import zlib
from pathlib import Path

DEB = "r-cran-janeaustenr"
RDATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
NOVELS = {
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
HELDOUT = "persuasion"


class RDeserializer:
    """Minimal reader for R's XDR serialization format (version 2 or 3).

    Handles what the janeaustenr data uses: NULL, symbols, pairlists,
    strings, logical/integer/double/character vectors and lists; a vector
    with a ``names`` attribute is returned as a dict.
    """

    def __init__(self, data):
        if data[:2] != b"X\n":
            raise ValueError("not an XDR-serialized R object")
        self.data, self.pos, self.refs = data, 2, []

    def _int(self):
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def read(self):
        """Read the header and return the top-level object."""
        version = self._int()
        self._int(), self._int()  # writer's R version, minimal R version
        if version == 3:
            length = self._int()
            self.pos += length  # skip the native encoding name
        return self._item()

    def _item(self):
        flags = self._int()
        kind, has_attr, has_tag = flags & 0xFF, flags & 0x200, flags & 0x400
        if kind == 254:  # NILVALUE_SXP
            return None
        if kind == 255:  # REFSXP: back-reference to an earlier symbol
            return self.refs[(flags >> 8 or self._int()) - 1]
        if kind == 1:  # SYMSXP
            self.refs.append(self._item())
            return self.refs[-1]
        if kind == 2:  # LISTSXP (pairlist): [attr] [tag] car cdr
            if has_attr:
                self._item()
            tag = self._item() if has_tag else None
            car = self._item()
            return [(tag, car)] + (self._item() or [])
        if kind == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                return None
            raw = self.data[self.pos : self.pos + n]
            self.pos += n
            return raw.decode("latin-1" if flags & (1 << 14) else "utf-8")
        if kind in (10, 13, 14, 16, 19):  # LGL, INT, REAL, STR, VEC
            n = self._int()
            if kind in (10, 13, 14):
                fmt = f">{n}{'d' if kind == 14 else 'i'}"
                values = list(struct.unpack_from(fmt, self.data, self.pos))
                self.pos += struct.calcsize(fmt)
            else:
                values = [self._item() for _ in range(n)]
            if has_attr:
                names = dict(self._item()).get("names")
                if names:
                    return dict(zip(names, values))
            return values
        raise ValueError(f"unsupported R SEXP type {kind}")


def fetch_novels(workdir):
    """Download and unpack the Debian package; return {novel: [lines]}."""
    download = ["apt-get", "download", DEB]
    if subprocess.run(download, cwd=workdir, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        subprocess.run(download, cwd=workdir, check=True, capture_output=True)
    deb = next(Path(workdir).glob(f"{DEB}_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(workdir) / "x")], check=True)
    base = Path(workdir) / "x" / RDATA
    index = RDeserializer(gzip.decompress(base.with_suffix(".rdx").read_bytes())).read()
    if index["compressed"] not in ([True], [1]):
        raise ValueError(f"unsupported lazy-load compression {index['compressed']}")
    rdb = base.with_suffix(".rdb").read_bytes()
    novels = {}
    for name, (offset, length) in index["variables"].items():
        blob = rdb[offset : offset + length]  # 4-byte big-endian size, then zlib
        novels[name] = RDeserializer(zlib.decompress(blob[4:])).read()
    return deb.name, novels


HEADING = re.compile(r"(chapter|volume) \w+\.?|\* \* \* \* \*|\(end of volume \w+\.\)", re.I)
END = re.compile(r"the end|finis|a note on the text", re.I)
SENTENCE_END = re.compile(r"[.!?][\"']?$")


def clean_novel(lines):
    """Turn a novel's raw lines into paragraphs of prose.

    Drops the title page (everything before the first chapter heading),
    chapter/volume headings, section breaks and the trailer after "THE END"
    or "Finis"; joins lines into paragraphs (blank line = break), removes the
    underscores marking italics and collapses whitespace.
    """
    paragraphs, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(" ".join(current).replace("_", "").split()))
            current = []
    first = next(i for i, p in enumerate(paragraphs) if HEADING.fullmatch(p))
    prose = []
    for p in paragraphs[first:]:
        if END.fullmatch(p):
            break
        if not HEADING.fullmatch(p):
            prose.append(p)
    return prose


def prompts_readme(items, seed, deb, command):
    """Markdown README for the prompt set."""
    return f"""# Prompt sets

## austen-heldout.jsonl

{len(items)} prompts from Jane Austen's *{NOVELS[HELDOUT]}* (1818, public domain), the novel
held out from training the bundled models in `examples/models/`. Text from Debian package
`{DEB}` (`{deb}`), cleaned as described in the model cards.

One JSON object per line: `{{"id", "prompt", "reference"}}`.
- `id`: `{HELDOUT}-NNNN`, NNNN being the paragraph's index in the cleaned novel.
- `prompt`: the first 12-20 words of a paragraph of at least 80 words (cut at a word
  boundary, with no trailing space).
- `reference`: the true continuation, the next 40-60 words of the same paragraph, ended at
  the last sentence end in that range when there is one. The original text is
  `prompt + " " + reference`.

Paragraphs and cut points are chosen with `random.Random({seed})`; items are in the
novel's order. Rebuilt (with the models) by

    {command}
"""

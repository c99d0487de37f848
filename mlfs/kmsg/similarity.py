"""The same bug under titles that differ only in noise: hashed TF-IDF over report texts.

A new signature is compared with the reports kept of its kind on its title and the
functions of its first block (`similarity_text`); at or above `DUPLICATE_SIMILARITY`
it joins the nearest one (`mlfs.kmsg.signatures.Reports.seen`).
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from mlfs.kmsg.kinds import mask

#: cosine similarity at or above which a new signature joins a known report of its kind.
#: With syzkaller-exact titles the signature does most of the work: on syzkaller's corpus
#: (tests/bench/kmsg_dedup.py) signature or >= 0.6 merged different bugs (precision 0.83),
#: >= 0.8 gives precision 0.94, recall 0.97 (F1 0.95) on same-title pairs and still joins a
#: title that differs only by a compiler suffix (`.cold`, tests/unit/test_kernel_log.py)
DUPLICATE_SIMILARITY = 0.8
#: lines of a report's block that go into its text for similarity
SIMILARITY_LINES = 40
#: hashed feature columns (the hashing trick: no vocabulary to grow or refit)
SIMILARITY_FEATURES = 1 << 16
#: tokens of one text kept (a title and `SIMILARITY_LINES` frames fit)
SIMILARITY_TOKENS = 64
_CONSOLE_PREFIX = re.compile(r"^\[\s*\d+\.\d+\]\s*(?:\[\s*[CT]\d+\]\s*)?")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]+")
_RIP = re.compile(r"^(?:RIP|pc|PC is at|IP): (?:[0-9a-f]{4}:)?\s*(?:\[<[0-9a-f]+>\] )?"
                  r"(?P<func>[\w.]+)\+0x")
_FRAME = re.compile(r"^\s*(?:\[<[0-9a-f]+>\] )?(?:\? )?(?P<func>[\w.]+)\+0x[0-9a-f]+/0x")


def similarity_text(title: str, lines: list[str]) -> str:
    """What two reports are compared on: the title and the functions of the first block,
    masked (addresses, numbers, offsets, device minors) and without console prefixes."""
    words = [title]
    for line in lines[:SIMILARITY_LINES]:
        line = _CONSOLE_PREFIX.sub("", line)
        frame = _FRAME.match(line) or _RIP.match(line.strip())
        if frame:
            words.append(frame.group("func"))
    return mask(" ".join(words))


def hashed_terms(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(feature columns, sublinear term frequencies) of `text`: identifiers hashed (crc32,
    stable across runs and hosts) into `SIMILARITY_FEATURES` columns."""
    counts: dict[int, int] = {}
    for token in _TOKEN.findall(text)[:SIMILARITY_TOKENS]:
        column = zlib.crc32(token.encode()) & (SIMILARITY_FEATURES - 1)
        counts[column] = counts.get(column, 0) + 1
    columns = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    tf = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
    return columns, tf


class Similarity:
    """TF-IDF over the reports kept of one kind, by the hashing trick: which known report a
    new one repeats, at a cost bounded by the reports kept, never by the reports seen.

    The inverse document frequencies are those of the reports kept now (document
    frequencies are counted as reports come and go), so words every report has (`Call`,
    `Trace`) weigh little and the functions that tell bugs apart weigh much.  Why not
    scikit-learn's TfidfVectorizer: it had to be refit on every kept text for each new
    signature, so a storm of 3,000 distinct titles held the GIL for 22 s against the
    trio thread and the kill switch (red team K11).  Here a new text costs one pass over
    a fixed-size array of the kept reports' terms (`capacity` × `SIMILARITY_TOKENS`).
    """

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self.df = np.zeros(SIMILARITY_FEATURES, dtype=np.float64)
        self._columns = np.zeros((0, SIMILARITY_TOKENS), dtype=np.int32)
        self._tf = np.zeros((0, SIMILARITY_TOKENS), dtype=np.float32)
        self._slot: dict[str, int] = {}
        self._ids: list[str | None] = []
        self._free: list[int] = []
        #: the most terms any text added so far has (columns past it are all empty)
        self._width = 1

    def __len__(self) -> int:
        return len(self._slot)

    def add(self, rid: str, text: str) -> None:
        if rid in self._slot:
            return
        if not self._free and len(self._ids) >= self.capacity:
            return  # the caller evicts first; a full index never grows
        columns, tf = hashed_terms(text)
        if not self._free:  # grow by doubling up to `capacity`
            old = len(self._ids)
            size = min(self.capacity, max(16, old * 2))
            self._columns = np.resize(self._columns, (size, SIMILARITY_TOKENS))
            self._tf = np.resize(self._tf, (size, SIMILARITY_TOKENS))
            self._tf[old:] = 0.0
            self._ids.extend([None] * (size - old))
            self._free.extend(range(size - 1, old - 1, -1))
        slot = self._free.pop()
        self._columns[slot] = 0
        self._tf[slot] = 0.0
        self._columns[slot, :len(columns)] = columns
        self._tf[slot, :len(tf)] = tf
        self.df[columns] += 1.0
        self._width = max(self._width, len(columns))
        self._slot[rid] = slot
        self._ids[slot] = rid

    def remove(self, rid: str) -> None:
        slot = self._slot.pop(rid, None)
        if slot is None:
            return
        used = self._tf[slot] > 0
        self.df[self._columns[slot][used]] -= 1.0
        self._tf[slot] = 0.0
        self._ids[slot] = None
        self._free.append(slot)

    def nearest(self, text: str) -> tuple[str | None, float]:
        """(id of the most similar known report, cosine similarity); (None, 0.0) if none.

        The frequencies count the new text too (as a fit on the known texts and the new
        one would), so a word only the new one has weighs as much as a rare word."""
        if not self._slot:
            return None, 0.0
        columns, tf = hashed_terms(text)
        if not len(columns):
            return None, 0.0
        n = len(self._slot) + 1
        query = np.zeros(SIMILARITY_FEATURES, dtype=np.float64)
        q_idf = np.log((1.0 + n) / (2.0 + self.df[columns])) + 1.0
        q = tf * q_idf
        q /= np.linalg.norm(q)
        query[columns] = q
        rows = self._columns[:len(self._ids), :self._width]
        in_query = (query[rows] != 0.0)
        idf = np.log((1.0 + n) / (1.0 + self.df[rows] + in_query)) + 1.0
        weights = self._tf[:len(self._ids), :self._width] * idf
        norms = np.sqrt((weights * weights).sum(axis=1))
        norms[norms == 0.0] = 1.0
        scores = (weights * query[rows]).sum(axis=1) / norms
        best = int(scores.argmax())
        if self._ids[best] is None:
            return None, 0.0
        return self._ids[best], float(scores[best])

"""Duplicate detection on syzkaller's crash corpus: signatures alone against learned similarity.

    python -m tests.bench.kmsg_dedup [--json FILE]

tests/data/syzkaller/linux-report/ holds real kernel crash logs, each with the title
syzkaller's authors gave it by hand (`TITLE:`); two logs with the same title are the
same bug.  Each log (console prefixes stripped) goes through mlfs.kmsg as the
`linux.kmsg` backend reads it: the first report's block and its signature (the block's
title by `mlfs.crash`, syzbot's formats; `python -m tests.bench.kmsg_titles` measures
that parser on whole logs, this bench on what `Blocks` hands it).  Over every
pair of logs, "same report" is predicted three ways:

- signature: the two signatures are equal (parsing alone);
- similarity: the TF-IDF cosine of the two reports' texts (`similarity_text`: title and
  the functions of the block) is at least a threshold;
- mlfs: what the daemon does, equal signatures or similarity at DUPLICATE_SIMILARITY.

Logs syzkaller marks CORRUPTED are left out (their titles say "corrupted", not a bug),
as are logs without a title or in which mlfs finds no report.  Precision and recall
are over pairs.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np

from mlfs.kmsg import DUPLICATE_SIMILARITY, Blocks, classify, similarity_text

CORPUS = Path(__file__).resolve().parents[1] / "data" / "syzkaller" / "linux-report"
_PREFIX = re.compile(r"^\[\s*\d+\.\d+\]\s*(?:\[\s*[CT]\d+\]\s*)?")


def load() -> list[tuple[str, str, list[str], str]]:
    """(syzkaller title, mlfs signature, block lines, file) per usable log."""
    out = []
    for path in sorted(CORPUS.iterdir(), key=lambda p: (len(p.name), p.name)):
        text = path.read_bytes().decode("utf-8", errors="replace")
        head, _, log = text.partition("\n\n")
        fields = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
        title = fields.get("TITLE")
        if not title or fields.get("CORRUPTED") == "Y":
            continue
        blocks = Blocks()
        found = None
        for seq, raw in enumerate(log.splitlines()):
            line = _PREFIX.sub("", raw)
            _, ended = blocks.feed(seq, line, classify(line))
            if ended is not None:
                found = ended
                break
        found = found or blocks.idle()
        if found is None:
            continue
        out.append((title, found.title, found.lines, path.name))
    return out


def pair_scores(pred: np.ndarray, truth: np.ndarray) -> dict:
    tp = int((pred & truth).sum())
    fp = int((pred & ~truth).sum())
    fn = int((~pred & truth).sum())
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    return {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
            "true_pairs_found": tp, "false_pairs": fp, "pairs_missed": fn}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    started = time.monotonic()
    logs = load()
    titles = np.array([t for t, _, _, _ in logs])
    signatures = np.array([s for _, s, _, _ in logs])
    texts = [similarity_text(s, lines) for _, s, lines, _ in logs]
    from sklearn.feature_extraction.text import TfidfVectorizer

    matrix = TfidfVectorizer(token_pattern=r"[A-Za-z_][A-Za-z0-9_.]+", lowercase=False,
                             sublinear_tf=True).fit_transform(texts)
    cosine = (matrix @ matrix.T).toarray()
    upper = np.triu_indices(len(logs), k=1)
    truth = (titles[:, None] == titles[None, :])[upper]
    same_signature = (signatures[:, None] == signatures[None, :])[upper]
    results = {"logs": len(logs), "pairs": int(len(truth)), "same_bug_pairs": int(truth.sum()),
               "signature": pair_scores(same_signature, truth), "similarity": {}}
    results["combined"] = {}
    for threshold in (0.5, 0.6, 0.7, 0.8, 0.9):
        results["similarity"][str(threshold)] = pair_scores(cosine[upper] >= threshold, truth)
        results["combined"][str(threshold)] = pair_scores(
            same_signature | (cosine[upper] >= threshold), truth)
    results["mlfs"] = pair_scores(same_signature | (cosine[upper] >= DUPLICATE_SIMILARITY),
                                  truth)
    results["mlfs"]["threshold"] = DUPLICATE_SIMILARITY
    results["titles_matching_syzkaller"] = round(float((titles == signatures).mean()), 4)
    results["seconds"] = round(time.monotonic() - started, 1)
    print(f"{results['logs']} logs, {results['pairs']} pairs, {results['same_bug_pairs']} "
          f"same-bug pairs; mlfs's title equals syzkaller's for "
          f"{results['titles_matching_syzkaller']:.1%} of logs")
    print(f"{'method':28} {'precision':>9} {'recall':>7} {'F1':>6}")
    rows = [("signatures alone", results["signature"])]
    rows += [(f"similarity >= {t}", r) for t, r in results["similarity"].items()]
    rows += [(f"signature or >= {t}", r) for t, r in results["combined"].items()]
    rows.append((f"mlfs (signature or >= {DUPLICATE_SIMILARITY})", results["mlfs"]))
    for name, r in rows:
        print(f"{name:28} {r['precision']:9.3f} {r['recall']:7.3f} {r['f1']:6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()

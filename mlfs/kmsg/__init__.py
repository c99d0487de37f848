"""The kernel's log, read the way the kernel writes it: records, kinds, devices, titles.

One place for every rule about the kernel log, so the `linux.kmsg` backend, the reports
built from its rows and the predictors counting device errors agree on what a record
says.  Pure Python, FUSE-free and cheap to import (backends import it; see
docs/kernel-log.md).  This package's face is the names below; each lives in the module
of its concept:

- `records`: a /dev/kmsg record parsed (`parse_record`), a message made `printable`;
- `kinds`: a message's kind, device and title (`classify`, `mask`), a crash block's
  title and guilty file by `mlfs.crash`'s table;
- `blocks`: the records of one crash report assembled across ticks (`Blocks`);
- `similarity`: a new title found to repeat a known report (hashed TF-IDF);
- `signatures`: one `Report` per signature, its file, and the bounded `Reports` kept;
- `masking` (with `words`): what may ship beyond the host (`private_masked`);
- `reports`: `mlfs reports` and `mlfs fleet reports`, the listings (imported on its own).
"""

from mlfs.kmsg.blocks import Block, Blocks
from mlfs.kmsg.kinds import (
    BLOCK_STATUS,
    KINDS,
    Classified,
    classify,
    complete_title,
    guilty_file,
    mask,
    mask_device,
)
from mlfs.kmsg.masking import PLACEHOLDERS, private_masked
from mlfs.kmsg.records import (
    FACILITY_KERNEL,
    FACILITY_USER,
    MAX_MESSAGE,
    Record,
    parse_record,
    printable,
)
from mlfs.kmsg.signatures import (
    BUDGETS,
    KERNEL_KINDS,
    MAX_ALIASES,
    MAX_BLOCK_LINES,
    MAX_REPORTS,
    REPEAT_EVENT_SECONDS,
    REPORTED_KINDS,
    USER_KINDS,
    Report,
    Reports,
    report_class,
    signature_id,
)
from mlfs.kmsg.similarity import (
    DUPLICATE_SIMILARITY,
    SIMILARITY_FEATURES,
    SIMILARITY_LINES,
    SIMILARITY_TOKENS,
    Similarity,
    hashed_terms,
    similarity_text,
)

__all__ = [
    "BLOCK_STATUS", "BUDGETS", "DUPLICATE_SIMILARITY", "FACILITY_KERNEL", "FACILITY_USER",
    "KERNEL_KINDS", "KINDS", "MAX_ALIASES", "MAX_BLOCK_LINES", "MAX_MESSAGE", "MAX_REPORTS",
    "PLACEHOLDERS", "REPEAT_EVENT_SECONDS", "REPORTED_KINDS", "SIMILARITY_FEATURES",
    "SIMILARITY_LINES", "SIMILARITY_TOKENS", "USER_KINDS", "Block", "Blocks", "Classified",
    "Record", "Report", "Reports", "Similarity", "classify", "complete_title", "guilty_file",
    "hashed_terms", "mask", "mask_device", "parse_record", "printable", "private_masked",
    "report_class", "signature_id", "similarity_text",
]

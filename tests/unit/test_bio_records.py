"""linux.bio's records as columns: what the capture did not see is null, never a number
that reads as a measurement (`records_table`)."""

import numpy as np
import pyarrow.compute as pc
from mlfs.backends.linux.bio import ERROR_UNKNOWN, RECORD, records_table


def _raw(*rows: tuple[int, int, int]) -> np.ndarray:
    """Records of device 7:3 (4 KiB reads) from (issue_ns, complete_ns, error)."""
    raw = np.zeros(len(rows), dtype=RECORD)
    for i, (issued, completed, error) in enumerate(rows):
        raw[i] = (issued, completed, 8 * i, (7 << 20) | 3, 4096, 100, 0, 1, error)
    return raw


def test_a_completion_no_program_saw_has_null_time_latency_and_status():
    table = records_table(_raw((1_000, 51_000, 0), (2_000, 0, int(ERROR_UNKNOWN))))
    assert table.column("latency_us").to_pylist() == [50.0, None]
    assert table.column("complete_ns").to_pylist() == [51_000, None]
    assert table.column("error").to_pylist() == [0, None]
    # the request is still a record of its device, size and issue
    assert table.column("bytes").to_pylist() == [4096, 4096]
    assert table.column("issue_ns").to_pylist() == [1_000, 2_000]
    assert pc.mean(table.column("latency_us")).as_py() == 50.0  # the unknown one left out


def test_an_issue_not_seen_leaves_the_latency_null_and_the_status_known():
    table = records_table(_raw((0, 9_000, 10)))
    assert table.column("latency_us").to_pylist() == [None]
    assert table.column("complete_ns").to_pylist() == [9_000]
    assert table.column("error").to_pylist() == [10]  # BLK_STS_IOERR
    assert table.column("op").to_pylist() == ["read"]

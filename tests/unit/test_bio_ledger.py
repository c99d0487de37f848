"""linux.bio's check against the block layer's own count: a completion the capture never
saw is counted lost once it is old enough, never twice, and never while its record may
still be on its way (`CompletionLedger`)."""

from mlfs.backends.linux.completions import BlockCompletions, CompletionLedger


def test_records_still_on_their_way_are_not_called_lost():
    ledger = CompletionLedger(completed=1000, slack=1.0, now=0.0)
    # 500 requests completed by t=0.5, their records not read yet
    assert ledger.observe(0.5, 1500, recorded=0, lost=0) == 0
    # by t=1.2 they came: the count of t=0.5 is due and every request is accounted
    assert ledger.observe(1.2, 1600, recorded=500, lost=0) == 0
    assert ledger.observe(2.5, 1600, recorded=100, lost=0) == 0
    assert ledger.unrecorded == 0


def test_a_completion_with_no_record_is_counted_once_when_it_is_old_enough():
    ledger = CompletionLedger(completed=0, slack=1.0, now=0.0)
    assert ledger.observe(0.5, 200_000, recorded=199_968, lost=0) == 0  # not yet due
    assert ledger.observe(1.6, 200_000, recorded=0, lost=0) == 32
    assert ledger.observe(2.8, 200_000, recorded=0, lost=0) == 0  # not again
    assert ledger.unrecorded == 32


def test_losses_the_ring_counted_are_not_counted_again():
    ledger = CompletionLedger(completed=0, slack=1.0, now=0.0)
    ledger.observe(0.5, 1000, recorded=900, lost=100)  # the ring had no room for 100
    assert ledger.observe(1.5, 1000, recorded=0, lost=0) == 0


def test_a_record_later_than_the_slack_leaves_the_loss_counted():
    ledger = CompletionLedger(completed=0, slack=1.0, now=0.0)
    ledger.observe(0.1, 10, recorded=0, lost=0)
    assert ledger.observe(1.2, 10, recorded=0, lost=0) == 10  # a stalled reader
    assert ledger.observe(1.3, 10, recorded=10, lost=0) == 0  # they came after all
    assert ledger.unrecorded == 10  # an upper bound, as linux.bio's docstring says


class ScriptedCompletions(BlockCompletions):
    """The counting rule over scripted /sys/block counts (the arithmetic alone)."""

    def __init__(self, script: list[dict[str, int]]) -> None:
        super().__init__(None)
        self.script = iter(script)

    def _counts(self) -> dict[str, int]:
        return next(self.script)


def test_a_disk_counts_from_where_it_was_first_seen_and_again_when_made_anew():
    counts = ScriptedCompletions([
        {"loop0": 500},                      # first seen: its history does not count
        {"loop0": 700},                      # 200 since
        {"loop0": 700, "loop1": 9000},       # loop1 added mid-run: nothing of it yet
        {"loop0": 50, "loop1": 9010},        # loop0 detached and attached anew: 50 + 10
        {"loop1": 9020},                     # loop0 gone: what it did stays counted
    ])
    assert [counts.total() for _ in range(5)] == [0, 200, 200, 260, 270]


def test_only_request_based_disks_of_this_machine_are_counted():
    from pathlib import Path

    counts = BlockCompletions(None)
    seen = counts._counts()
    assert all(Path(f"/sys/block/{name}/mq").is_dir() for name in seen)
    assert counts.total() == 0  # every disk starts where it was first seen

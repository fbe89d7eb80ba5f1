"""What the ``soak`` scenario measures on disk, and its flatness rule.

Kept apart from the scenario (which needs etcd and agents) so the rule and
the walk are unit-tested on their own: a verdict that says "flat" must be
known to say "growing" for a leak.

The rule (:func:`flatness`): drop the warm-up, split what is left into four
quarters by time, and call a series flat when the largest value of the last
quarter is at most :data:`FLAT_RATIO` times the largest of the second. A
series growing steadily from zero after the warm-up scores 2.0; one that
stopped growing scores 1.0. The second quarter, not the first, is the
reference: the first may still hold the tail of the warm-up (logs waiting
out their delete grace). Maxima, not means: retention trims in steps (a
sweep every few seconds), so each series is a saw-tooth whose peaks are
what a disk must hold.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from etcdsched.logs.store import ARCHIVE_NAME

FLAT_RATIO = 1.2
"""Last quarter's max / second quarter's max at most this: room for the
saw-tooth of trims between sweeps (a few runs per job either way), far
below the 2.0 of a series that grows with the runs."""
MIN_SAMPLES = 8
"""Fewer samples after the warm-up than this: no verdict (two a quarter)."""


@dataclass
class DiskUsage:
    """One walk of the log directory: logs and archives apart. ``*_bytes``
    are disk usage as ``du`` counts it (allocated blocks, directories
    included), not file lengths: many small logs take whole blocks."""

    log_bytes: int = 0
    log_files: int = 0
    run_dirs: int = 0
    archive_bytes: int = 0
    run_dirs_per_job: dict[str, int] = field(default_factory=dict)


def _du(stat: os.stat_result) -> int:
    return stat.st_blocks * 512


def disk_usage(root: Path) -> DiskUsage:
    """Walk ``<root>/<job>/<run>/attempt-<n>.log`` and ``<root>/<job>/archive.jsonl``.

    Entries vanishing mid-walk (retention deleting a run's logs) are
    skipped: the walk is a sample, not a snapshot."""
    usage = DiskUsage()
    for job in _entries(root):
        if not job.is_dir(follow_symlinks=False):
            continue
        usage.log_bytes += _du(job.stat(follow_symlinks=False))
        runs = 0
        for entry in _entries(Path(job.path)):
            try:
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.name == ARCHIVE_NAME:
                usage.archive_bytes += _du(stat)
            elif entry.is_dir(follow_symlinks=False):
                runs += 1
                usage.log_bytes += _du(stat) + _files_du(Path(entry.path), usage)
        usage.run_dirs += runs
        usage.run_dirs_per_job[job.name] = runs
    return usage


def _files_du(run_dir: Path, usage: DiskUsage) -> int:
    total = 0
    for entry in _entries(run_dir):
        try:
            total += _du(entry.stat(follow_symlinks=False))
        except OSError:
            continue
        usage.log_files += 1
    return total


def _entries(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as found:
            return list(found)
    except OSError:  # gone since it was listed
        return []


class ArchiveLines:
    """Runs archived so far, counted incrementally: each sample reads only
    what was appended since the last. An archive cut back to its bound
    (``ARCHIVE_KEEP_BYTES``: past 16 MiB, about 10,000 runs of one job)
    is shorter than what was read; its count then restarts from what is
    left, and :attr:`cut` says the total became a lower bound."""

    def __init__(self) -> None:
        self._read: dict[Path, tuple[int, int]] = {}
        self.cut = False

    def count(self, root: Path) -> int:
        for archive in root.glob(f"*/{ARCHIVE_NAME}"):
            offset, lines = self._read.get(archive, (0, 0))
            try:
                size = archive.stat().st_size
                if size < offset:
                    self.cut, offset, lines = True, 0, 0
                with archive.open("rb") as file:
                    file.seek(offset)
                    data = file.read()
            except OSError:
                continue
            self._read[archive] = (offset + len(data), lines + data.count(b"\n"))
        return sum(lines for _, lines in self._read.values())


@dataclass(frozen=True)
class Flatness:
    """One series after the warm-up (see the module's rule)."""

    first: float
    last: float
    peak: float
    q2_max: float
    q4_max: float
    per_1000_runs: float | None
    """Least-squares growth per 1,000 runs ended: ~0 when flat."""

    @property
    def ratio(self) -> float:
        return self.q4_max / self.q2_max if self.q2_max else (1.0 if not self.q4_max else 2.0)

    @property
    def flat(self) -> bool:
        return self.ratio <= FLAT_RATIO


def flatness(
    t_s: list[float], runs: list[float], values: list[float], warm_up_s: float
) -> Flatness | None:
    """The rule over the samples taken after ``warm_up_s``; None if too few."""
    kept = [(t, r, v) for t, r, v in zip(t_s, runs, values, strict=True) if t >= warm_up_s]
    if len(kept) < MIN_SAMPLES:
        return None
    start, span = kept[0][0], (kept[-1][0] - kept[0][0]) or 1.0

    def quarter(q: int) -> list[float]:
        return [v for t, _, v in kept if min(3, int(4 * (t - start) / span)) == q]

    return Flatness(
        first=kept[0][2],
        last=kept[-1][2],
        peak=max(v for *_, v in kept),
        q2_max=max(quarter(1), default=0.0),
        q4_max=max(quarter(3), default=0.0),
        per_1000_runs=_slope([r for _, r, _ in kept], [v for *_, v in kept]),
    )


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs``, per 1,000 of ``xs``."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if not spread:
        return None
    return 1000 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread

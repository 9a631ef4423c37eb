"""The bookies as ``aiobk bookies list`` shows them (``aiobk.autorecovery.roster``): the
registry, the cookies and the auditor's published view combined (pure)."""

from __future__ import annotations

from aiobk.autorecovery.roster import LOST, roster
from aiobk.metadata import READ_ONLY, AuditorStatus, BookieServiceInfo, Cookie


def test_roster_combines_registry_cookies_and_the_auditors_view() -> None:
    now = 1_000_000
    registered = [
        BookieServiceInfo("b:1", "b:1", free_bytes=5),
        BookieServiceInfo("a:1", "a:1", READ_ONLY),
    ]
    leases = {"a:1": (1.0, 10.0), "b:1": (6.0, 10.0)}  # b:1 missed its refresh at 3.3 s
    cookies = [
        Cookie("a:1", "a:1", ("j",), ("d",), "i1"),
        Cookie("c:1", "10.0.0.3:3181", ("j",), ("d",), "i3"),  # gone, absent per the auditor
        Cookie("d:1", "d:1", ("j",), ("d",), "i4"),  # gone, no auditor word on it
    ]
    status = AuditorStatus(
        "a:1",
        lost_bookies={"e:1": 400_000},  # lost, no cookie: still listed
        missing_bookies={"c:1": 900_000, "f:1": 950_000},  # f:1: no cookie, not lost: left out
    )
    entries = roster(registered, leases, cookies, status, now)
    assert [(e.bookie_id, e.state) for e in entries] == [
        ("a:1", "readonly"),
        ("b:1", "writable"),
        ("c:1", LOST),
        ("d:1", LOST),
        ("e:1", LOST),
    ]
    a, b, c, d, e = entries
    assert (a.last_heard, a.late) == (999_000, False)
    assert (b.last_heard, b.late, b.free_bytes) == (994_000, True, 5)
    assert (c.address, c.absent_since, c.lost_by_auditor) == ("10.0.0.3:3181", 900_000, False)
    assert (d.absent_since, d.last_heard) == (None, None)
    assert (e.absent_since, e.lost_by_auditor) == (400_000, True)
    document = b.to_document()
    old_fields = {"id", "address", "state", "software_version", "free_bytes", "total_bytes"}
    assert old_fields <= document.keys()
    assert roster(registered, {}, [], None, now)[0].last_heard is None

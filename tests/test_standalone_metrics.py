"""``aiobk standalone --http-port BASE``: bookie i serves its admin API and metrics on BASE + i,
with the event-loop lag, the metadata connectivity gauge, and the autorecovery figures
labelled by ``bookie`` as the bookie's are (``node`` kept)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from aiobk.metadata.etcd_process import free_port, port_in_use
from tests.support.wait import wait_until_sync

BOOKIES = 2


def _free_run(count: int) -> int:
    """A port P with P + 1 .. P + count - 1 free too."""
    for _attempt in range(50):
        port = free_port()
        if port + count <= 65535 and not any(
            port_in_use("127.0.0.1", port + i) for i in range(1, count)
        ):
            return port
    raise RuntimeError(f"no {count} consecutive free ports after 50 tries")


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read().decode()


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(2))
    return None


@pytest.mark.timeout(120)
def test_standalone_http_port_serves_each_bookies_admin_api_and_metrics(tmp_path: Path) -> None:
    etcd_port = _free_run(2)
    http_base = _free_run(BOOKIES)
    output: list[str] = []
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "aiobk", "standalone", "--bookies", str(BOOKIES),
            "--data-dir", str(tmp_path / "data"), "--etcd-port", str(etcd_port),
            "--bookie-port", "0", "--http-port", str(http_base),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip

    def read() -> None:
        assert proc.stdout is not None
        output.extend(proc.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:

        def ready() -> bool:
            assert proc.poll() is None, "".join(output)
            return any("cluster ready" in line for line in output)

        wait_until_sync(ready, timeout=60, every=0.1, what=lambda: "".join(output))
        ids = [m.group(1) for line in output if (m := re.match(r"bookie (\S+) serving on", line))]
        assert len(ids) == BOOKIES, output
        for index, bookie_id in enumerate(ids):
            base = f"http://127.0.0.1:{http_base + index}"
            status, _body = _get(f"{base}/heartbeat")
            assert status == 200
            status, info = _get(f"{base}/api/v1/bookie/info")
            assert status == 200
            assert bookie_id in info
            _status, text = _get(f"{base}/metrics")
            assert _sample(text, "aiobk_bookie_writable", bookie=bookie_id) == 1
            assert _sample(text, "aiobk_metadata_connected", bookie=bookie_id) == 1
            both = {"bookie": bookie_id, "node": bookie_id}
            assert _sample(text, "aiobk_autorecovery_ledgers_marked_total", **both) == 0
            assert "aiobk_event_loop_lag_seconds_bucket" in text
        # The lag is measured (every 0.5 s), and the auditor counts the live bookies.
        texts: list[str] = []
        seen: list[object] = []

        def measured_and_counted() -> bool:
            texts[:] = [
                _get(f"http://127.0.0.1:{http_base + i}/metrics")[1] for i in range(BOOKIES)
            ]
            lags = _sample(texts[0], "aiobk_event_loop_lag_seconds_count") or 0
            counted = [
                _sample(text, "aiobk_autorecovery_bookies_registered", bookie=bookie_id)
                for text, bookie_id in zip(texts, ids, strict=True)
            ]
            seen[:] = [lags, counted]
            return lags >= 2 and BOOKIES in counted

        wait_until_sync(
            measured_and_counted, timeout=30, every=0.5, what=lambda: f"lags, counted: {seen}"
        )
        assert (
            max(
                _sample(t, "aiobk_autorecovery_bookies_writable", bookie=b) or 0
                for t, b in zip(texts, ids, strict=True)
            )
            == BOOKIES
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        reader.join(10)
        if proc.stdout is not None:
            proc.stdout.close()

"""The data source's options, parsed once, and the one place it connects to the cluster.

Every option, its default and what it does is listed in the Spark guide (docs/guide/spark.md;
a test keeps the two in step); errors name the option and the form it takes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiobk.client import BookKeeper, LogPosition
from aiobk.client.log.format import ENVELOPE, RAW
from aiobk.client.tls_files import TlsFilesError, client_context, from_environment

# A new column goes at the end (producer_id and sequence follow position), so code that takes
# a row's fields or the columns by index keeps working.
SCHEMA = (
    "log string, ledger_id long, entry_id long, data binary, key binary, "
    "headers map<string,binary>, timestamp timestamp, position string, "
    "producer_id string, sequence long"
)
DEFAULT_SPLIT = 100_000
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0  # seconds, as Spark's Kafka source

T = TypeVar("T")

EARLIEST = "earliest"
LATEST = "latest"
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*", re.ASCII)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

# A log's bound: "earliest", "latest" or a position (LEDGER:ENTRY).
Bound = str | LogPosition


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    text = options.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, not {text!r}") from None
    if value < minimum:
        raise ValueError(f"option {name!r} must be at least {minimum}, not {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name!r} must be true or false, not {text!r}")


def duration(text: str, name: str) -> float:
    """Seconds in ``"500ms"``, ``"30s"``, ``"15m"``, ``"1h"``, ``"2d"`` or plain seconds."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"option {name!r} must be a duration such as 30s or 15m, not {text!r}")
    return float(match[1]) * _UNITS[match[2]]


def _position(value: Any, name: str, log: str) -> Bound:
    if isinstance(value, str) and value.strip().lower() in (EARLIEST, LATEST):
        return value.strip().lower()
    if isinstance(value, str):
        try:
            return LogPosition.parse(value)
        except ValueError:
            pass
    if isinstance(value, dict) and set(value) == {"ledger", "entry"}:
        ledger, entry = value["ledger"], value["entry"]
        if isinstance(ledger, int) and isinstance(entry, int) and ledger >= 0 and entry >= 0:
            return LogPosition(ledger, entry)
    raise ValueError(
        f"option {name!r}: log {log!r}: {value!r} is not earliest, latest, LEDGER:ENTRY or "
        '{"ledger": L, "entry": E}'
    )


def _bounds(options: Mapping[str, str], name: str, default: str) -> tuple[str, dict[str, Bound]]:
    """(the bound of every log not named, {log: bound}): ``earliest``, ``latest`` or a JSON
    object of log name -> bound."""
    text = options.get(name, default).strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower(), {}
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise ValueError(
            f"option {name!r} must be earliest, latest or a JSON object of log -> position "
            f'(e.g. {{"orders": "12:0"}}), not {text!r}'
        )
    return default, {str(log): _position(value, name, str(log)) for log, value in document.items()}


@dataclass(frozen=True)
class Options:
    metadata: str
    log: str = ""  # one log ("log"), or the first of "logs"
    logs: tuple[str, ...] = ()  # every named log ("log" or "logs")
    pattern: str = ""  # "logPattern": a regex over log names (full match)
    ledgers: tuple[int, ...] = ()
    password: bytes = b""
    split: int = DEFAULT_SPLIT
    min_partitions: int | None = None
    start: str = EARLIEST  # the starting bound of logs not in start_positions
    start_positions: dict[str, Bound] = field(default_factory=dict)
    end: str = LATEST
    end_positions: dict[str, Bound] = field(default_factory=dict)
    start_time: int | None = None  # ms
    end_time: int | None = None  # ms
    fail_on_data_loss: bool = True
    max_records: int | None = None
    max_bytes: int | None = None
    min_records: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    record_format: str | None = None  # writes: the format of logs the job creates
    # TLS to the bookies (tlsCa/tlsCert/tlsKey, else AIOBK_TLS_* where the job is planned):
    # file paths every executor must be able to read.
    tls_files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, writing: bool = False) -> Options:
        """The options; ``writing``: a write may name no log (rows carry a ``log`` column)."""
        metadata = options.get("metadata", "")
        if not metadata:
            raise ValueError("the aiobk data source needs .option('metadata', 'etcd://...')")
        named = [options["log"]] if options.get("log") else []
        named += [x.strip() for x in options.get("logs", "").split(",") if x.strip()]
        pattern = options.get("logPattern", "")
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"option 'logPattern' is no regular expression: {exc}") from None
        try:
            ledgers = tuple(int(x) for x in options.get("ledgers", "").split(",") if x.strip())
        except ValueError:
            raise ValueError("option 'ledgers' must be comma-separated ledger ids") from None
        if sum(map(bool, (named, pattern, ledgers))) != 1 and not (writing and not pattern):
            raise ValueError(
                "the aiobk data source needs exactly one of .option('log', NAME), 'logs' "
                "(NAME,NAME,...), 'logPattern' (a regex over log names) or 'ledgers'"
            )
        start, start_positions = _bounds(options, "startingPosition", EARLIEST)
        end, end_positions = _bounds(options, "endingPosition", LATEST)
        start_time = _int(options, "startingTimestamp", None, 0)
        end_time = _int(options, "endingTimestamp", None, 0)
        if start_time is not None and "startingPosition" in options:
            raise ValueError("give 'startingPosition' or 'startingTimestamp', not both")
        if end_time is not None and "endingPosition" in options:
            raise ValueError("give 'endingPosition' or 'endingTimestamp', not both")
        record_format = options.get("recordFormat")
        if record_format is not None and record_format not in (RAW, ENVELOPE):
            raise ValueError(f"option 'recordFormat' must be {RAW} or {ENVELOPE}")
        delay = options.get("maxTriggerDelay")
        tls_files = {
            kind: options[name]
            for kind, name in (("ca", "tlsCa"), ("cert", "tlsCert"), ("key", "tlsKey"))
            if options.get(name)
        } or from_environment()
        try:
            client_context(**tls_files)  # bad files fail the job where it is planned
        except TlsFilesError as exc:
            raise ValueError(f"options tlsCa/tlsCert/tlsKey: {exc}") from None
        return cls(
            metadata=metadata,
            log=named[0] if named else "",
            logs=tuple(dict.fromkeys(named)),
            pattern=pattern,
            ledgers=ledgers,
            password=options.get("password", "").encode(),
            split=_int(options, "split", DEFAULT_SPLIT, 1) or DEFAULT_SPLIT,
            min_partitions=_int(options, "minPartitions", None, 1),
            start=start,
            start_positions=start_positions,
            end=end,
            end_positions=end_positions,
            start_time=start_time,
            end_time=end_time,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            max_records=_int(options, "maxRecordsPerTrigger", None, 1),
            max_bytes=_int(options, "maxBytesPerTrigger", None, 1),
            min_records=_int(options, "minRecordsPerTrigger", None, 1),
            max_trigger_delay=(
                DEFAULT_MAX_TRIGGER_DELAY if delay is None else duration(delay, "maxTriggerDelay")
            ),
            record_format=record_format,
            tls_files=tls_files,
        )

    def run(self, action: Callable[[BookKeeper], Awaitable[T]]) -> T:
        """Connect, run ``action`` and close, from Spark's synchronous callbacks (driver or
        executor): every piece of work the source does goes through here, one connection each."""

        tls = client_context(**self.tls_files)

        async def main() -> T:
            async with await BookKeeper.connect(self.metadata, tls=tls) as bk:
                return await action(bk)

        return asyncio.run(main())


__all__ = ["DEFAULT_SPLIT", "EARLIEST", "LATEST", "SCHEMA", "Bound", "Options", "duration"]

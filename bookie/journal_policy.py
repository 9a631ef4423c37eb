"""When the journal flushes: the group-commit decision, pure.

Theory of operation. Adds are queued as encoded records. The writer task takes the whole queue,
writes it with one ``write`` and one ``fdatasync``, then acknowledges every add in it. While that
I/O runs, new adds pile up and become the next batch, so under load one fdatasync covers many
adds without any waiting on purpose. This policy only decides whether to start a batch now or
wait a little for more, with BookKeeper's three knobs:

- ``flush_when_queue_empty``: start as soon as the writer is free (the default here).
- ``buffered_bytes_threshold``: start once this many bytes are queued.
- ``max_group_wait``: otherwise start once the oldest queued record has waited this long.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupCommitPolicy:
    max_group_wait: float = 0.002
    buffered_bytes_threshold: int = 512 * 1024
    flush_when_queue_empty: bool = True

    def flush_delay(self, queued_bytes: int, oldest_enqueued_at: float, now: float) -> float | None:
        """Seconds to wait before flushing the queue; 0.0 means now, None means nothing queued."""
        if queued_bytes <= 0:
            return None
        if self.flush_when_queue_empty or queued_bytes >= self.buffered_bytes_threshold:
            return 0.0
        return max(0.0, oldest_enqueued_at + self.max_group_wait - now)

"""Logs over ledgers: ``append`` (taking a log, the Spark sink's appends), ``writer``,
``reader``, ``by_time`` (a log position at a time), ``format`` (the record envelope),
``position``; ``ledger_client`` is what they need of a client. The public names are exported by
``aiobk.client``."""

"""``make soak``: a week of routine operations, compressed into minutes, on real processes.

A three-member etcd cluster and four bookies (autorecovery on, as by default) run as
subprocesses on free loopback ports in a temporary directory. Three services, each a
subprocess of its own, use them as an application would:

- a log writer appending records of ~1 KiB at a steady pace (a new ``append`` every 2.5 ms, at
  most 64 in flight), each carrying its sequence number, its ledgers rolling every 256 KiB;
  it reports every acknowledgement (sequence, position, latency) and every failure;
- a tailing reader (``open_log_reader(..., follow=True)``) reporting every record it reads;
- churn: small ledgers created, written and deleted every ~2 s, so that the bookies' entry
  logs hold dead data for garbage collection and compaction to reclaim.

The harness itself is the operator and the nemesis: it truncates the log below what the
reader has passed every ~60 s, SIGKILLs a bookie and restarts it on its data every ~150 s,
restarts an etcd member now and then, and samples every process's memory (from /proc), every
data directory's size and the bookie registry. Short runs scale the intervals down so that
each happens several times (``SoakSettings.scaled``).

At the end (``checks``): every acknowledged record was read exactly once, at the position its
acknowledgement gave, and the log holds the records in the order of their sequence numbers
(the order of the writer's ``append`` calls); the writer never failed; retention never failed
twice in a row; no server died on its own and no running bookie stayed out of the registry
for more than a minute; no process's memory and no data directory kept growing over the
second half of the run beyond a bound. The report (``report``) has the per-minute append
latency, the memory and disk series, the faults injected and the verdict: JSON to a file, a
text summary on stdout.
"""

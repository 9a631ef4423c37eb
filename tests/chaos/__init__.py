"""Real-process chaos: etcd and bookies as subprocesses behind fault-injecting proxies."""

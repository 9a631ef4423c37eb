# The one entry point: `make setup` then `make test` on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The source directories; each but aiobk/ is mapped into the aiobk namespace by a symlink there.
SOURCES := protocol bookie client metadata tiered autorecovery pipeline bench aiobk
PYTEST_ARGS ?=

.PHONY: setup system-packages test soak lint unit-protocol unit-pure docs run bench sim chaos fuzz pipeline-demo clean

setup: system-packages $(VENV)/.installed

# A server binary on PATH or in /usr/sbin (Debian puts nats-server there, off a user's PATH);
# aiobk bench peers runs nats-server and redis-server.
have = { command -v $(1) >/dev/null 2>&1 || test -x /usr/sbin/$(1); }

system-packages:
	@need=""; \
	command -v etcd >/dev/null 2>&1 || need="$$need etcd-server"; \
	command -v java >/dev/null 2>&1 || need="$$need openjdk-17-jre-headless"; \
	command -v systemd-analyze >/dev/null 2>&1 || need="$$need systemd"; \
	$(call have,nats-server) || need="$$need nats-server"; \
	$(call have,redis-server) || need="$$need redis-server"; \
	if [ -n "$$need" ]; then \
		echo "installing system packages:$$need"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$need; \
	fi; \
	command -v etcd >/dev/null 2>&1 || { echo "etcd still not on PATH after install" >&2; exit 1; }; \
	command -v systemd-analyze >/dev/null 2>&1 || \
		{ echo "systemd-analyze still not on PATH after install" >&2; exit 1; }; \
	for server in nats-server redis-server; do \
		$(call have,$$server) || { echo "$$server still not installed after install" >&2; exit 1; }; \
	done

# The compiled extensions' sources too: an editable install builds them once, so a change to them
# needs the install again (setup.py).
$(VENV)/.installed: pyproject.toml setup.py bookie/_records.pyx protocol/_runs.pyx \
		protocol/_adds.pyx protocol/_crc32c.h protocol/_bigendian.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,dev]'
	@# Spark's Python workers must run the venv's interpreter, not the system one.
	grep -q PYSPARK_PYTHON $(VENV)/bin/activate || \
		printf '\nexport PYSPARK_PYTHON="%s"\nexport PYSPARK_DRIVER_PYTHON="%s"\n' \
		"$$(pwd)/$(PY)" "$$(pwd)/$(PY)" >> $(VENV)/bin/activate
	touch $@

lint: setup
	$(VENV)/bin/ruff check $(SOURCES) tests docs/hooks
	$(VENV)/bin/ruff format --check $(SOURCES) tests docs/hooks
	$(VENV)/bin/mypy aiobk tests/sim tests/chaos tests/fuzz tests/soak tests/compat
	$(VENV)/bin/lint-imports

# The pure codec must be fully covered by its own tests.
unit-protocol: setup
	$(PY) -m pytest -q tests/protocol --cov=aiobk.protocol --cov-report=term-missing --cov-fail-under=100 $(PYTEST_ARGS)

# The bookie's record tier, the client's adds and range reads and the offload objects once more
# on the pure Python code the compiled extensions stand for (AIOBK_NO_EXTENSIONS=1): the main run
# uses the extensions, and both must pass the same tests.
PURE_TIER = tests/bookie/test_record_codecs.py tests/bookie/test_journal_pure.py \
	tests/bookie/test_journal.py tests/bookie/test_entrylog_reads.py tests/bookie/test_add_batch.py \
	tests/bookie/test_bad_input.py tests/protocol/test_batch.py tests/client/test_range_reads.py \
	tests/client/test_run_check.py tests/protocol/test_offload_object.py tests/tiered/test_objects.py \
	tests/protocol/test_add_codecs.py tests/client/test_digest.py tests/client/test_add_batches.py
unit-pure: setup
	AIOBK_NO_EXTENSIONS=1 $(PY) -m pytest -q -p no:cacheprovider $(PURE_TIER) $(PYTEST_ARGS)

# PYTHONHASHSEED=0: a simulator seed that fails here replays the same way under `make sim`.
# Two pytest workers, a test file each at a time (--dist loadfile keeps a file's fixtures in one
# process): most tests wait on sockets, fsyncs and etcd, so two workers share two cores well
# (28 min -> 19 min for the same suite). Tests marked soak (minutes each) run in `make soak`.
# A worker that dies (a native crash) fails the run at once, naming its test, instead of being
# replaced: with --dist loadfile a replaced worker can leave pytest-xdist's controller waiting
# forever (pytest-dev/pytest-xdist#784). SUITE_TIMEOUT bounds the whole run anyway:
# a hung run fails after SUITE_TIMEOUT seconds rather than waiting for CI's job limit.
TEST_WORKERS ?= 2
SUITE_TIMEOUT ?= 2400
PYTEST_RUN = PYTHONHASHSEED=0 PYSPARK_PYTHON=$(abspath $(PY)) PYSPARK_DRIVER_PYTHON=$(abspath $(PY)) \
	$(PY) -m pytest -q tests --ignore=tests/protocol
# The documentation site (mkdocs.yml; docs/README.md): strict, so a broken link, anchor or API
# reference, or a setting without a description, fails the build. Output in site/ (git-ignored).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean --quiet --site-dir site

test: lint unit-protocol unit-pure docs
	timeout --kill-after=30 $(SUITE_TIMEOUT) env $(PYTEST_RUN) -m "not soak" -n $(TEST_WORKERS) \
		--dist loadfile --max-worker-restart=0 --durations=25 $(PYTEST_ARGS) \
		|| { status=$$?; df -h "$${TMPDIR:-/tmp}" | tail -1 | awk '{print "free space for test data:", $$4, "of", $$2}'; exit $$status; }

# The soak of real processes (tests/soak): etcd and bookies, a log writer, a tailing reader,
# retention, churn, bookie kills and etcd restarts for SOAK_MINUTES of load, judged at the end;
# the JSON report goes to SOAK_REPORT, the summary to stdout. Then the long tests: etcd's
# database over 100,000 ledgers churned. Both run; either failing fails the target.
SOAK_MINUTES ?= 5
SOAK_REPORT ?= $(or $(TMPDIR),/tmp)/aiobk-soak-report.json
soak: setup
	status=0; \
	$(PY) -m tests.soak --minutes $(SOAK_MINUTES) --report $(SOAK_REPORT) || status=1; \
	$(PYTEST_RUN) -m soak $(PYTEST_ARGS) || status=1; \
	exit $$status

run: setup
	$(VENV)/bin/aiobk standalone

bench: setup
	$(PY) -m aiobk.bench.journal
	$(PY) -m aiobk.bench.metadata
	$(PY) -m aiobk.bench.add
	$(PY) -m aiobk.bench.autorecovery
	$(PY) -m aiobk.bench.peers
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m aiobk.bench.spark

# Deterministic simulation: `make sim SEED=n` replays one run with its trace; `make sim
# SEEDS=10000` runs a campaign (FIRST=, PROFILE=mixed|race|crashes|loss|racks|producers|offload,
# SIMARGS= for more).
SEEDS ?= 1000
FIRST ?= 0
PROFILE ?= mixed
sim: setup
	PYTHONHASHSEED=0 $(PY) -m tests.sim $(if $(SEED),--seed $(SEED),--seeds $(SEEDS) --first $(FIRST)) --profile $(PROFILE) $(SIMARGS)

# Real processes: etcd + 5 bookies behind fault-injecting proxies, with the journal and without,
# autorecovery in the bookies; CHAOS_WIPES bookies at most killed and wiped for good (each once
# the last is repaired; 0: none), and at the end every copy restored (I15).
CHAOS_SECONDS ?= 60
CHAOS_FAULTS ?= 30
CHAOS_WIPES ?= 2
chaos: setup
	$(PY) -m tests.chaos --seconds $(CHAOS_SECONDS) --faults $(CHAOS_FAULTS) --wipes $(CHAOS_WIPES)

# Coverage-guided fuzzing of every byte parser (frames, messages, entries, journal records,
# offload objects) and of the storage encoders with every value the protocol admits.
FUZZ_RUNS ?= 2000000
fuzz: setup
	$(PY) -m tests.fuzz.codec -runs=$(FUZZ_RUNS)
	$(PY) -m tests.fuzz.storage -runs=$(FUZZ_RUNS)
	$(PY) -m tests.fuzz.offload -runs=$(FUZZ_RUNS)

# The example Spark job: JSON events in a log -> totals per kind -> Parquet (demo-output/).
pipeline-demo: setup
	PYSPARK_PYTHON=$(abspath $(PY)) PYSPARK_DRIVER_PYTHON=$(abspath $(PY)) $(PY) -m aiobk.pipeline.demo

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis .coverage bench/results demo-output \
		standalone-data bookie/_records.c bookie/_records.*.so

# Every target bootstraps what it needs: a .venv with the package and its dev tools,
# and the Node driver of the real @waku/sds for the interop tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
JS     := tests/interop/js
JSSTAMP := $(JS)/node_modules/.installed-stamp
# js-waku's relay node (sdk 0.0.27, libp2p 1) and light node (sdk 0.0.36, libp2p 2) cannot
# share one node_modules: each driver has its own folder. reliability_grpc is the Node
# gRPC client of `sdsync reliability serve`. web is the chat page's source (make web).
NODE_JS_DIRS := tests/interop/waku_relay tests/interop/waku_light tests/interop/reliability_grpc web
NODESTAMPS := $(NODE_JS_DIRS:%=%/node_modules/.installed-stamp)
PYTEST_ARGS ?=

.PHONY: demo check test soak web lint typecheck proto bench bench-memory bench-reconcile bench-sim bench-reliability bench-waku fuzz clean postgres chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,p2p]'
	$(PY) -m pip install --quiet --no-deps 'libp2p==0.8.1'  # see the p2p extra in pyproject.toml
	touch $@

$(JSSTAMP): $(JS)/package.json $(JS)/package-lock.json
	cd $(JS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(NODESTAMPS): %/node_modules/.installed-stamp: %/package.json %/package-lock.json
	cd $* && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The store tests start a throwaway PostgreSQL cluster (tests/store/conftest.py): they need
# the server binaries, installed from Debian's package only when the machine lacks them
# (without the package's own main cluster; the tests start theirs on a free port).
PG_CTL := $(firstword $(wildcard /usr/lib/postgresql/*/bin/pg_ctl) $(shell command -v pg_ctl))

postgres:
ifeq ($(PG_CTL),)
	@echo "PostgreSQL server binaries missing: installing Debian's postgresql package"
	mkdir -p /etc/postgresql-common/createcluster.d
	echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/sdsync.conf
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql
endif

# The browser tests (tests/web) drive Debian's Chromium through Playwright, whose own
# browser download is not reachable from CI: the package is installed when no Chromium is.
CHROMIUM := $(firstword $(shell command -v chromium chromium-browser))

chromium:
ifeq ($(CHROMIUM),)
	@echo "Chromium missing: installing Debian's chromium package"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
endif

# The chat page's script (sdsync store serve --web): web/ bundled by esbuild into the
# package, with chat.json recording the hashes it was built from (tests/web/test_chat_bundle.py
# checks both). Run after changing web/src or web/package-lock.json, and commit the result.
web: web/node_modules/.installed-stamp
	node web/build.mjs

demo: $(STAMP)
	$(VENV)/bin/sdsync demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The edit-test loop (~70 s here, under two minutes from cold caches): ruff, mypy, then the
# tests that start no process (tests/noprocess.py), each Hypothesis test at 10 examples and
# the three load tests left out (tests/quickcheck.py). It needs only the venv: no npm, apt,
# PostgreSQL, Chromium or Spark. A test that starts a process here fails, saying to mark it.
# 3 workers: many tests wait on sockets and timers (on 2 cores, a quarter faster than 2).
# Bytecode is written: pytest's rewritten test modules are cached (~10 s a worker).
# make test runs everything.
check: $(STAMP) lint typecheck
	env -u SDSYNC_REQUIRE_POSTGRES -u SDSYNC_SOAK -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest \
		-n 3 --dist worksteal --timeout 120 --no-processes -m "not slow" --max-examples 10 \
		$(PYTEST_ARGS)

test: $(STAMP) $(JSSTAMP) $(NODESTAMPS) postgres chromium lint typecheck
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

# The reliability service's kill -9 harness at 500 seeds instead of make test's 50
# (tests/reliability/test_crash_harness.py); SDSYNC_CRASH_REPORT=file.json keeps the table.
# --dist load: both workers (make test keeps the harness in one, beside no chat process).
# Then a js-waku light node takes 10,000 Filter pushes from `sdsync store serve` (1,000 in
# make test): none lost, none twice, its connection never dropped. Then 2,000 libp2p
# connections opened and closed against one host (300 in make test), still served.
# Then issue 27's attacks on a real `sdsync store serve` at their larger sizes, its RSS and
# an honest peer's latency measured (tests/store/test_hostile_node.py), and every other
# hostile-peer module. Last, the chat page in Chromium: 10 outages of page B, each with a
# burst of 20 lines from each of two pages and a terminal chat (3 of 4 in make test).
# Also our store node killed with SIGKILL while 5,000 messages come from nwaku by
# Waku Sync (600 in make test), and 100 SIGKILLs under LightPush and POST load, every
# answered message checked after each (3 in make test); and a node serving two chat
# pages and two terminal chats killed and restarted 20 times (once in make test).
soak: $(STAMP) tests/interop/waku_light/node_modules/.installed-stamp chromium
	SDSYNC_SOAK=1 $(PY) -m pytest -n 2 --dist load $(PYTEST_ARGS) tests/reliability/test_crash_harness.py
	SDSYNC_SOAK=1 $(PY) -m pytest $(PYTEST_ARGS) tests/interop/test_js_waku_filter_load.py
	SDSYNC_SOAK=1 $(PY) -m pytest $(PYTEST_ARGS) tests/transport/test_libp2p_hostile.py
	SDSYNC_SOAK=1 $(PY) -m pytest -s $(PYTEST_ARGS) tests/store/test_hostile_node.py tests/store/test_public_pages.py
	SDSYNC_SOAK=1 $(PY) -m pytest -s $(PYTEST_ARGS) tests/store/test_kill_acknowledged.py
	SDSYNC_SOAK=1 $(PY) -m pytest -s $(PYTEST_ARGS) tests/web/test_node_restart.py
	SDSYNC_SOAK=1 $(PY) -m pytest $(PYTEST_ARGS) tests/store/test_store_budgets_hostile.py \
		tests/store/test_relay_hostile.py tests/store/test_filter_hostile.py \
		tests/store/test_sync_riblt_hostile.py tests/store/test_rest_timeouts.py \
		tests/transport/test_relay_rate.py tests/reliability/test_hostile_buffers.py \
		tests/reliability/test_hostile_grpc.py
	SDSYNC_SOAK=1 $(PY) -m pytest $(PYTEST_ARGS) tests/interop/test_nwaku_sync.py -k killed
	SDSYNC_SOAK=1 $(PY) -m pytest $(PYTEST_ARGS) tests/web/test_chat_browser.py -k bursts

proto: $(STAMP)
	cd src && PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(CURDIR)/$(PY) -m grpc_tools.protoc -I. \
		--python_out=. --mypy_out=. sdsync/wire/sds_message.proto sdsync/wire/waku_message.proto \
		sdsync/waku/store/waku_store.proto sdsync/waku/lightpush/waku_lightpush.proto \
		sdsync/waku/filter/waku_filter.proto sdsync/waku/metadata/waku_metadata.proto \
		sdsync/reconcile/prolly.proto sdsync/waku/sync/waku_sync.proto
	cd src && PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(CURDIR)/$(PY) -m grpc_tools.protoc -I. \
		--python_out=. --mypy_out=. --grpc_python_out=. --mypy_grpc_out=. \
		sdsync/reliability/reliability.proto

bench: $(STAMP) $(JSSTAMP)
	$(PY) bench/core_vs_js.py

# Core memory on a 10k / 100k / 300k message stream, beside @waku/sds at 10k (~8 min).
bench-memory: $(STAMP) $(JSSTAMP)
	$(PY) bench/core_memory.py

# RBSR and Prolly-tree sync vs negentropy (nostr-tools), N = 1M; a few minutes.
bench-reconcile: $(STAMP)
	cd bench/js/negentropy && npm ci --no-audit --no-fund --loglevel=error
	$(PY) bench/reconcile_vs_negentropy.py

# The simulator's speed and memory at 100 / 1,000 / 10,000 participants, causal history 200
# (docs/simulation.md#performance); about 10 minutes.
bench-sim: $(STAMP)
	$(PY) bench/sim_scale.py

# The reliability API through `sdsync reliability serve` vs in-process: calls/s, p50/p99
# (docs/reliability.md#performance); under a minute.
bench-reliability: $(STAMP)
	$(PY) bench/reliability_grpc.py

# Waku relay (100 B / 4 kB / 40 kB), LightPush and Filter: sdsync beside go-waku 0.9.0
# (../shared/tools/go-waku or SDSYNC_GO_WAKU), msg/s, p50/p99 and ratios; a few minutes.
bench-waku: $(STAMP)
	$(PY) bench/waku_vs_go_waku.py

fuzz: $(STAMP)
	$(PY) bench/fuzz_decoders.py --examples 100000

clean:
	rm -rf $(VENV) $(JS)/node_modules $(NODE_JS_DIRS:%=%/node_modules) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# OPT4TorchDataset developer entry points. Everything runs from a fresh clone:
# the first target that needs it creates .venv with the pinned dependencies.
# A plain `make` prints this list and does nothing else (make help).
#
#   make install build the package (C engine + extension) into .venv
#   make demo    capture a seeded sampler, plan, compare OPT with LRU/FIFO; then train a
#                small CNN end to end against no cache, LRU and in memory (tables, plots in out/)
#   make test    every test: ruff and mypy, C (plain, ASan+UBSan, TSan, built without libcurl),
#                the binding under ASan+UBSan, fuzzing (corpus replay, then FUZZ_SECONDS=10 a
#                target), the cluster loader under torchrun, Python; every stage runs, then one
#                summary table (scripts/test_stages.py); budgets per stage in docs/testing.md
#   make fuzz-long  each fuzz target for 10 minutes, what it finds merged into tests/fuzz/corpus/
#   make bench   the benchmarks (writes bench/results/*.json)
#   make bench-e2e  a real training loop on an emulated slow store, every cache side by side
#   make bench-env  .venv-bench: torch 2.14.1 + torchvision, MosaicML Streaming, LitData, this package
#   make bench-e2e-full  the end-to-end comparison at scale, with the real alternatives (three hours or more on 2 cores)
#   make bench-e2e-s3  the comparison over a loopback S3 server (moto), every configuration and peer reading from it

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.deps-installed
JOBS   ?= 2
# Seconds of libFuzzer per target in `make test`: the corpus replay, then
# new inputs for what is left of them (0 skips the fuzzing run; the
# checked-in corpus is replayed by ctest either way). The long runs are
# `make fuzz-long`.
FUZZ_SECONDS ?= 10

.PHONY: all help demo install test lint test-c test-without test-asan test-asan-binding test-tsan test-fuzz test-python \
	test-cluster-loader \
	bench bench-e2e clean fuzz-long test-kill-long bench-env bench-e2e-full bench-e2e-s3

# The default goal: the list of targets (this file's header), nothing built
# or run. `make all` builds and installs the package, as `make install`.
help:
	@sed -n '1,/^$$/s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

all: install

$(STAMP): requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements-dev.txt
	@touch $@

# Build and install the package (C engine + extension) into .venv, again
# only when a source file changed since the last install.
SOURCES   := $(shell find src include binding python third_party -type f \( -name '*.c' -o -name '*.h' \
               -o -name '*.py' -o -name '*.pyi' -o -name 'py.typed' \) 2>/dev/null) CMakeLists.txt pyproject.toml
INSTALLED := $(VENV)/.opt4-installed
$(INSTALLED): $(STAMP) $(SOURCES)
	$(PIP) install --quiet --no-build-isolation --no-deps --force-reinstall .
	@touch $@

install: $(INSTALLED)

demo: install
	$(VENV)/bin/opt4torch demo

# Every stage runs, whatever fails before it; one summary at the end
# (scripts/test_stages.py), and the exit status says whether all passed.
# TEST_BESIDE runs from the start beside the others, which run one after
# another: the Python tests keep about one of two cores busy, the rest fill the
# other (docs/testing.md, "Time budget"). TEST_BESIDE= runs every stage in turn.
TEST_STAGES := lint test-c test-without test-asan test-asan-binding test-tsan test-fuzz test-cluster-loader test-python
TEST_BESIDE ?= test-python
test: install
	@$(PY) scripts/test_stages.py $(if $(TEST_BESIDE),--beside $(TEST_BESIDE),) $(TEST_STAGES)

# ruff over the package, mypy (strict, pyproject.toml) over its runtime: a
# stage of make test (docs/dependencies.md says why these two).
lint: $(STAMP)
	$(VENV)/bin/ruff check python tests/python/test_package_shape.py
	$(VENV)/bin/mypy

define ctest_build
	$(VENV)/bin/cmake -S . -B build/$(1) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
	    -DOPT4_BUILD_TESTS=ON $(2) > build-$(1).log 2>&1 || { cat build-$(1).log; exit 1; }
	$(VENV)/bin/cmake --build build/$(1) -j $(JOBS)
	cd build/$(1) && $(abspath $(VENV)/bin/ctest) --output-on-failure -j $(JOBS) $(3)
	@rm -f build-$(1).log
endef

test-c: $(STAMP)
	$(call ctest_build,ctest,-DCMAKE_BUILD_TYPE=Release,)

test-asan: $(STAMP)
	$(call ctest_build,asan,-DCMAKE_BUILD_TYPE=Debug -DOPT4_SANITIZE=address$(comma)undefined,)

# The binding (binding/_engine.c: the record decoder, the batch calls) under
# ASan+UBSan: a sanitized build of the package in build/asan-binding, driven
# by the Python tests that exercise it (spawned workers are left to
# test-python: they would only repeat the forked ones, slower).
#
# The compiler is clang-19 where it is installed (.ci/run installs it): its
# ASan runtime locks its allocator around fork. GCC 12's does not, so a
# DataLoader worker forked while any thread of the parent (CPython's queue
# feeder threads included) was inside that allocator could deadlock: plain
# torch with no opt4torch at all hung in 1 of 3 runs of 200 epochs of
# non-persistent fork workers under GCC 12's ASan (docs/testing.md).
ASAN_BINDING := build/asan-binding
ASAN_CC := $(shell command -v clang-19 2>/dev/null)
ifneq ($(ASAN_CC),)
ASAN_PRELOAD = $$($(ASAN_CC) -print-file-name=libclang_rt.asan-x86_64.so)
ASAN_DESELECT :=
else
ASAN_CC := $(CC)
ASAN_PRELOAD = $$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)
ASAN_DESELECT := --deselect tests/python/test_fork_safety.py
endif
test-asan-binding: $(STAMP)
	@mkdir -p $(ASAN_BINDING)
	@echo "test-asan-binding: the binding built with $(ASAN_CC) -fsanitize=address,undefined"
	@if [ -n "$(ASAN_DESELECT)" ]; then echo "test-asan-binding: no clang-19, so GCC's ASan, whose allocator is" \
	    "not fork-safe: test_fork_safety.py runs in test-python only (apt-get install clang-19 to run it here)"; fi
	CC=$(ASAN_CC) $(PIP) install --quiet --no-build-isolation --no-deps --upgrade --target $(ASAN_BINDING)/site \
	    -C cmake.define.OPT4_SANITIZE=address,undefined -C cmake.build-type=Debug \
	    -C build-dir=$(ASAN_BINDING)/build . > $(ASAN_BINDING).log 2>&1 || { cat $(ASAN_BINDING).log; exit 1; }
	@rm -f $(ASAN_BINDING).log
	LD_PRELOAD="$(ASAN_PRELOAD)" \
	    ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=$(ASAN_BINDING)/site \
	    $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_XDIST) tests/python/test_codec.py tests/python/test_dataloader.py \
	    tests/python/test_cachelib.py tests/python/test_sized.py tests/python/test_prefetch.py \
	    tests/python/test_bad_input.py tests/python/test_worker_kill.py tests/python/test_fork_safety.py \
	    tests/python/test_sources.py tests/python/test_cluster.py tests/python/test_cluster_pools.py \
	    tests/python/test_live.py tests/python/test_objstore.py \
	    -k "not spawn and not forkserver" $(ASAN_DESELECT)

# The build of a machine without the optional C libraries (docs/dependencies.md).
# No libcurl: CMake's find_package(CURL) made to fail; the engine, the binding
# and the C tests are built warning-free, the C tests run (the S3 reader's skip
# with the reason), and the package built there is imported and drives the
# object store through s3torchconnector. No libcrypto, and OPT4_S3=OFF: the
# engine and binding build (the same code as without libcurl; what differs is
# CMake's choice, which these two configure steps check).
WITHOUT := build/without
WITHOUT_CMAKE = $(VENV)/bin/cmake -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
	-DCMAKE_BUILD_TYPE=Release -DOPT4_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(abspath $(PY))
test-without: $(STAMP)
	@echo "test-without: no libcurl (-DCMAKE_DISABLE_FIND_PACKAGE_CURL=TRUE): engine, binding, C tests, import"
	$(WITHOUT_CMAKE) -S . -B $(WITHOUT)/curl -DOPT4_BUILD_TESTS=ON -DCMAKE_DISABLE_FIND_PACKAGE_CURL=TRUE \
	    > $(WITHOUT)-curl.log 2>&1 || { cat $(WITHOUT)-curl.log; exit 1; }
	@grep -q "S3 reader: not built" $(WITHOUT)-curl.log || { cat $(WITHOUT)-curl.log; \
	    echo "test-without: CMake did not say the S3 reader is not built"; exit 1; }
	$(VENV)/bin/cmake --build $(WITHOUT)/curl -j $(JOBS)
	cd $(WITHOUT)/curl && $(abspath $(VENV)/bin/ctest) --output-on-failure -j $(JOBS)
	@grep -h "^SKIPPED:" $(WITHOUT)/curl/Testing/Temporary/LastTest.log | sort -u | sed 's/^/test-without: /'
	@rm -rf $(WITHOUT)/curl/site && mkdir -p $(WITHOUT)/curl/site
	cp -r python/opt4torch python/OPT4TorchDataSet $(WITHOUT)/curl/site/
	cp $(WITHOUT)/curl/_engine*.so $(WITHOUT)/curl/site/opt4torch/
	PYTHONPATH=$(WITHOUT)/curl/site $(PY) -c "import opt4torch, opt4torch._engine as e; \
	    assert opt4torch._engine.__file__.startswith('$(abspath $(WITHOUT))'), e.__file__; \
	    assert e.HAVE_S3 == 0, 'built with the S3 reader'; print('test-without: imported', e.__file__)"
	PYTHONPATH=$(WITHOUT)/curl/site $(PY) -m pytest -q -p no:cacheprovider tests/python/test_objstore.py \
	    -k "without or numbers_and_bytes or loader_prefetch_is_exact"
	@echo "test-without: no libcrypto (-DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=TRUE), then OPT4_S3=OFF: engine and binding"
	$(WITHOUT_CMAKE) -S . -B $(WITHOUT)/crypto -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=TRUE \
	    > $(WITHOUT)-crypto.log 2>&1 || { cat $(WITHOUT)-crypto.log; exit 1; }
	@grep -q "S3 reader: not built" $(WITHOUT)-crypto.log || { cat $(WITHOUT)-crypto.log; exit 1; }
	$(VENV)/bin/cmake --build $(WITHOUT)/crypto -j $(JOBS)
	$(WITHOUT_CMAKE) -S . -B $(WITHOUT)/off -DOPT4_S3=OFF > $(WITHOUT)-off.log 2>&1 || { cat $(WITHOUT)-off.log; exit 1; }
	@! grep -q "S3 reader: libcurl" $(WITHOUT)-off.log || { echo "test-without: OPT4_S3=OFF built the reader"; exit 1; }
	$(VENV)/bin/cmake --build $(WITHOUT)/off -j $(JOBS)
	@rm -f $(WITHOUT)-curl.log $(WITHOUT)-crypto.log $(WITHOUT)-off.log

# ThreadSanitizer runs the concurrent tests (label "concurrent").
test-tsan: $(STAMP)
	$(call ctest_build,tsan,-DCMAKE_BUILD_TYPE=Debug -DOPT4_SANITIZE=thread,-L concurrent --no-tests=ignore)

test-fuzz: $(STAMP)
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(JOBS) CMAKE=$(abspath $(VENV)/bin/cmake) NINJA=$(abspath $(VENV)/bin/ninja) \
	    scripts/fuzz.sh

# Each libFuzzer target for FUZZ_LONG_SECONDS (10 minutes by default), JOBS
# at a time, merging what it finds into tests/fuzz/corpus/ (docs/reliability.md).
# Not part of `make test`; CI may run it when it has the time.
FUZZ_LONG_SECONDS ?= 600
fuzz-long: $(STAMP)
	FUZZ_SECONDS=$(FUZZ_LONG_SECONDS) FUZZ_JOBS=$(JOBS) FUZZ_MERGE=1 CMAKE=$(abspath $(VENV)/bin/cmake) \
	    NINJA=$(abspath $(VENV)/bin/ninja) nice -n 10 scripts/fuzz.sh

# The kill test at scale: KILL_READS reads checked while workers are killed
# (docs/reliability.md records the figures). `make test` runs 100,000.
KILL_READS ?= 1000000
test-kill-long: $(STAMP)
	$(VENV)/bin/cmake -S . -B build/ctest -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
	    -DOPT4_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release > /dev/null
	$(VENV)/bin/cmake --build build/ctest -j $(JOBS) --target test_pool_kill
	build/ctest/test_pool_kill $(KILL_READS)

# Every Python test, the slow ones included (a bare pytest deselects them),
# on PYTEST_PROCS processes (pytest-xdist), a test file each at a time: many
# tests wait (on spawned workers, torchrun jobs, a server that never answers)
# more than they compute. Each process makes its pools in a namespace of its
# own (tests/python/conftest.py). Off by default (PYTEST_PROCS=0, one
# process) until the hang of test_e2e_over_the_s3_server seen once under
# -n 2 is understood (docs/testing.md); PYTEST_PROCS=2 turns it on.
PYTEST_PROCS ?= 0
PYTEST_XDIST = $(if $(filter-out 0,$(PYTEST_PROCS)),-n $(PYTEST_PROCS) --dist loadfile,)
# The cluster loader end to end under torchrun (several processes a job, both
# cores): a stage of its own, in make test's other lane, so that the two lanes
# end together (docs/testing.md, "Time budget"). test-python runs the rest.
CLUSTER_LOADER_TESTS := tests/python/test_cluster_exit.py tests/python/test_cluster_loader.py \
	tests/python/test_cluster_resume.py tests/python/test_cluster_faults.py
# Both print their 15 slowest tests (build/test-logs/*.log): the time
# budget's ledger (docs/testing.md, "Time budget").
test-python: install
	$(PY) -m pytest -q $(PYTEST_XDIST) --durations=15 -m "slow or not slow" \
	    $(addprefix --ignore=,$(CLUSTER_LOADER_TESTS)) tests/python

test-cluster-loader: install
	$(PY) -m pytest -q $(PYTEST_XDIST) --durations=15 -m "slow or not slow" $(CLUSTER_LOADER_TESTS)

# The benchmarks (each prints a markdown table and writes bench/results/*.json;
# bench/RESULTS.md records the medians with the machine and the command).
bench: install
	$(PY) bench/plan_speed.py
	$(PY) bench/capture_speed.py
	$(PY) bench/sim_speed.py
	CMAKE=$(abspath $(VENV)/bin/cmake) $(PY) bench/lookup.py
	$(PY) bench/compat_modes.py
	$(PY) bench/codec_speed.py

# End to end: a small CNN trained on generated JPEGs read from an emulated slow
# store, under no cache, cachetools, a shared LRU, a static cache, OPT, OPT +
# prefetch and in memory; writes bench/results/e2e.{md,json} and the plots
# (the data is generated once into out/e2e-data).
bench-e2e: install
	$(PY) bench/e2e.py

# The benchmark environment for the real alternatives (docs/e2e.md): its own
# venv, since MosaicML Streaming imports torchvision, whose PyPI builds need
# their own (CUDA) torch; .venv and the tests keep the pinned CPU torch.
BENCH_VENV      := .venv-bench
BENCH_PY        := $(BENCH_VENV)/bin/python
BENCH_STAMP     := $(BENCH_VENV)/.deps-installed
BENCH_INSTALLED := $(BENCH_VENV)/.opt4-installed
$(BENCH_STAMP): requirements-bench.txt
	@test -x $(BENCH_PY) || $(PYTHON) -m venv $(BENCH_VENV)
	nice -n 10 $(BENCH_PY) -m pip install --quiet --upgrade pip
	nice -n 10 $(BENCH_PY) -m pip install --quiet -r requirements-bench.txt
	$(BENCH_PY) -c "import streaming, litdata, torchvision; print('bench env: streaming', streaming.__version__, \
	    'litdata', litdata.__version__, 'torchvision', torchvision.__version__)"
	@touch $@
$(BENCH_INSTALLED): $(BENCH_STAMP) $(SOURCES)
	nice -n 10 $(BENCH_PY) -m pip install --quiet --no-build-isolation --no-deps --force-reinstall .
	@touch $@
bench-env: $(BENCH_INSTALLED)

# The comparison at scale (issue 19): 50,000 JPEGs of 15-97 KB (160-400 px), 3 epochs,
# capacity 25 % and 50 %, epoch shuffle and class-balanced sampling, the real
# alternatives beside OPT. V11_SRC=PATH: a checkout of OPT4TorchDataSet v1.1.0
# (without it, that row is skipped with a line saying so). Writes
# bench/results/e2e-full-{25,50}.{md,json,png}. On 2 cores: three hours or more (six of the
# configurations took 27-29 minutes a capacity under shuffle alone; Streaming's defaults thrash
# for over an hour at this size: docs/e2e.md).
V11_SRC   ?=
FULL_ARGS ?= --images 50000 --image-size 160 --image-size-max 400 --epochs 3 --repeats 1 \
	--samplers shuffle,balanced --data out/e2e-full-data --progress \
	--configs "no cache,LRU (cachetools),Streaming,Streaming (tuned),LitData,OPT4TorchDataSet v1.1.0,OPT4TorchDataSet API (compat),OPT,OPT + prefetch,in memory"
bench-e2e-full: bench-env
	nice -n 10 $(BENCH_PY) bench/e2e.py $(FULL_ARGS) --capacity 0.25 --name e2e-full-25 $(if $(V11_SRC),--v11-src $(V11_SRC),)
	nice -n 10 $(BENCH_PY) bench/e2e.py $(FULL_ARGS) --capacity 0.5 --name e2e-full-50 $(if $(V11_SRC),--v11-src $(V11_SRC),)

# The comparison over an object store (issue 19): 2,000 JPEGs of 15-97 KB, 3 epochs, 50 %,
# epoch shuffle, every configuration and peer reading the same images from the loopback S3
# server (bench/s3server.py: moto, 5 ms a request, 100 MB/s a response), then again with the
# server's responses sharing one link of LINK bytes/s, at 50 % and 25 %, and under class-balanced
# sampling (the sharded peers shuffle only); then with the server's CPU off the training core
# (training on CPU 0, the server on CPU 1, as a store runs on machines of its own), with no
# shared link and with one of SPLIT_LINK bytes/s, OPT + prefetch there with the engine's GETs and
# with s3torchconnector's side by side. Writes bench/results/e2e-s3-*.
# About 75 minutes on 2 cores (Streaming's defaults thrash: about 2.5 minutes a run).
LINK    ?= 30e6
SPLIT_LINK ?= 20e6
S3_ARGS ?= --store s3 --images 2000 --image-size 160 --image-size-max 400 --epochs 3 --capacity 0.5 \
	--repeats 3 --samplers shuffle --data out/e2e-s3-data
bench-e2e-s3: bench-env
	nice -n 10 $(BENCH_PY) bench/e2e.py $(S3_ARGS) --name e2e-s3-50 $(if $(V11_SRC),--v11-src $(V11_SRC),) \
	    --configs "no cache,LRU (cachetools),Streaming,Streaming (tuned),LitData,OPT4TorchDataSet v1.1.0,OPT4TorchDataSet API (compat),OPT + prefetch,in memory"
	nice -n 10 $(BENCH_PY) bench/e2e.py $(S3_ARGS) --link $(LINK) --name e2e-s3-50-link \
	    --configs "no cache,Streaming (tuned),LitData,OPT + prefetch,in memory"
	nice -n 10 $(BENCH_PY) bench/e2e.py $(S3_ARGS) --link $(LINK) --capacity 0.25 --name e2e-s3-25-link \
	    --configs "no cache,Streaming (tuned),LitData,OPT + prefetch,in memory"
	nice -n 10 $(BENCH_PY) bench/e2e.py $(S3_ARGS) --link $(LINK) --samplers balanced --name e2e-s3-50-link-balanced \
	    $(if $(V11_SRC),--v11-src $(V11_SRC),) \
	    --configs "no cache,LRU (cachetools),OPT4TorchDataSet v1.1.0,OPT4TorchDataSet API (compat),OPT + prefetch,in memory"
	nice -n 10 $(BENCH_PY) bench/e2e.py $(S3_ARGS) --train-cpus 0 --server-cpus 1 --name e2e-s3-50-split \
	    --configs "no cache,Streaming (tuned),LitData,OPT + prefetch,OPT + prefetch (s3torchconnector),in memory"
	nice -n 10 $(BENCH_PY) bench/e2e.py $(S3_ARGS) --train-cpus 0 --server-cpus 1 --link $(SPLIT_LINK) \
	    --name e2e-s3-50-link-split \
	    --configs "no cache,Streaming (tuned),LitData,OPT + prefetch,OPT + prefetch (s3torchconnector),in memory"

clean:
	rm -rf build dist out *.egg-info

comma := ,

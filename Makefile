# The two set-up commands of README.md.  Each installs what it needs; Go builds are cached in
# ${DRILLS_CACHE:-~/.cache/drills}, so a second run starts in seconds.  Binaries build while the drills whose
# binaries are ready already run (a lock per component keeps concurrent builders apart).
PYTHON ?= python3
TEST_CONTROLLERS ?= v1.8.2,v1.10.2
# pytest-xdist workers for the framework's own tests (each with an embedded cluster of its own); the drills
# themselves run in one of them, TEST_LANE_JOBS legs side by side (tests/test_lanes.py).  The defaults follow the
# cache: with every component the session needs already built, the tests mostly wait (on the controllers, holds and
# pauses) and more of them side by side keep the cores busy; from empty caches the Go builds already fill the cores
# and more tests beside them slow the builds every test waits for.
# (two cores, 970 tests, warm: 17.9 min with six workers and four legs at a time, 62 % of the cores busy; 15.5 with
# eight workers and eight legs (75 %); 14.3 and 15.6 on two runs with the longest files handed out first as well
# (85 and 81 %); ten workers 15.4 (85 %: the cores are the limit).  From empty caches: 30.4 min with six and four
# (84 %, every build done at minute 17.8), 34.2 with eight and eight (83 %, the builds slower beside the tests: done
# at minute 26.0).  Eight workers and eight legs held about 14 GiB of memory at the busiest: on a smaller machine set
# both lower, e.g. TEST_WORKERS=4 TEST_LANE_JOBS=4).  Since lanes abort, order and escape run their probes side by side
# within a leg (three or four Rollouts, each abort and escape probe with its own Locust, mesh emulator and Prometheus),
# eight legs at once put more than thirty runnable processes on the two cores (load 33): a promtool run that takes
# 7 CPU-s passed its 120 s timeout and an apiserver missed a 2 s deadline (run s69); with five the peak load was 22
# and the run 16.2 min, 993 passed (run s70)
# the components beside the controllers that the tests build (make toolchain; tests/conftest.py's SESSION_EXTRAS)
TEST_EXTRAS = prometheus,registry,kube-state-metrics
TOOLCHAIN_BUILT = $(shell $(PYTHON) -c 'from drills.toolchain import Toolchain, components_for, resolve_controller_versions as v; t = Toolchain(); print("yes" if all(t.is_built(c) for c in components_for(v("$(TEST_CONTROLLERS)", check_served=False), "$(TEST_EXTRAS)".split(","))) else "no")' 2>/dev/null)
TEST_WORKERS ?= $(if $(filter yes,$(TOOLCHAIN_BUILT)),8,6)
TEST_LANE_JOBS ?= $(if $(filter yes,$(TOOLCHAIN_BUILT)),5,4)
# more pytest arguments for the tests (e.g. --junitxml=FILE); the drills' own pytest runs never see them
PYTEST_ARGS ?=

.PHONY: drills test install toolchain wheel

# the package (editable) with its test extra, at the versions constraints.txt pins (the ones tested)
install:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'

# the wheel a user installs (pip install dist/drills-*.whl): the package and its built-in data (setup.py)
wheel:
	rm -rf build
	$(PYTHON) -m pip wheel --quiet --disable-pip-version-check --no-deps -w dist .

toolchain: install
	$(PYTHON) -m drills toolchain build --controller $(TEST_CONTROLLERS) --extra $(TEST_EXTRAS)

# The main job: the drills on the embedded default cluster, writing reports/.
drills: install
	$(PYTHON) -m drills run $(DRILLS_ARGS)

# The tests: the framework's own tests and the drills (every lane), on v1.8.2 and v1.10.2.
# The tests start hundreds of Python processes (the drills' commands, the legs' pytest runs): their bytecode is
# cached for the session, even where PYTHONDONTWRITEBYTECODE is set, in a folder of its own (mode 0700, removed at
# the end; $PYTHONPYCACHEPREFIX when set), never in the checkout and never where another user could plant a .pyc
# (collecting the tests 10.1 -> 3.8 CPU-s, a `drills cluster status` 0.59 -> 0.32)
test: install
	tmp=; prefix="$${PYTHONPYCACHEPREFIX:-}"; \
	if [ -z "$$prefix" ]; then tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/drills-pycache.XXXXXX") && prefix="$$tmp"; fi; \
	trap '[ -z "$$tmp" ] || rm -rf "$$tmp"' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX="$$prefix" DRILLS_TEST_LANE_JOBS=$(TEST_LANE_JOBS) \
	$(PYTHON) -m pytest -p no:locust -q -rfE -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --controller $(TEST_CONTROLLERS) $(PYTEST_ARGS) tests

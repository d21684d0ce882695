# The two set-up commands of README.md.  Each installs what it needs; Go builds are cached in
# ${DRILLS_CACHE:-~/.cache/drills}, so a second run starts in seconds.
PYTHON ?= python3
TEST_CONTROLLERS ?= v1.8.2,v1.10.2
EXTRAS ?= registry,prometheus

.PHONY: drills test install toolchain

install:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e .

toolchain: install
	$(PYTHON) -m drills toolchain build --controller $(TEST_CONTROLLERS) --extra $(EXTRAS)

# The main job: the drills on the embedded default cluster, writing reports/.
drills: install
	$(PYTHON) -m drills toolchain build --extra $(EXTRAS)
	$(PYTHON) -m drills run $(DRILLS_ARGS)

# The tests: the framework's own tests and the drills, on v1.8.2 and v1.10.2.
test: toolchain
	$(PYTHON) -m pytest -p no:locust -q -rfE --controller $(TEST_CONTROLLERS) tests lanes

# The README's two commands. Both create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
SCENARIO ?= scenarios/quickstart.yaml

.PHONY: run test fuzz lint format bench soak clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/servesim run $(SCENARIO)

# The suite runs on every core (pytest-xdist; at most 4 workers, whose memory the machine must
# hold; work stealing, as a few tests take 10-30 s): 10 minutes on one core of the 2-core
# machine it is developed on, under 6 on both. `python -m pytest` alone runs it in one process.
test: $(VENV)/.installed-dev
	$(BIN)/ruff check simulator tests benchmarks
	$(BIN)/ruff format --check simulator tests benchmarks
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist worksteal

# The long fuzz budget (the suite runs the same tests with a small one): FUZZ_EXAMPLES per
# test (whole-simulation tests take at most 1,000), in a process capped at FUZZ_MEMORY_MB.
FUZZ_EXAMPLES ?= 10000
FUZZ_MEMORY_MB ?= 6144
fuzz: $(VENV)/.installed-dev
	HYPOTHESIS_PROFILE=fuzz SERVESIM_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		SERVESIM_MEMORY_CAP_MB=$(FUZZ_MEMORY_MB) \
		$(BIN)/python -m pytest tests/test_fuzz_inputs.py tests/test_fuzz_configs.py

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check simulator tests benchmarks
	$(BIN)/ruff format --check simulator tests benchmarks

format: $(VENV)/.installed-dev
	$(BIN)/ruff format simulator tests benchmarks
	$(BIN)/ruff check --fix simulator tests benchmarks

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/run.py --baseline benchmarks/baseline.csv --markdown docs/performance.md

# 1,000,000 requests through a multi-instance cluster; memory must stay flat (minutes).
soak: $(VENV)/.installed
	$(BIN)/python benchmarks/soak.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

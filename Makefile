# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-full lint bench samples clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(None if (3, 11) <= v < (3, 14) else \
		f"mpconvert needs Python 3.11 to 3.13, and $(PYTHON) is {v[0]}.{v[1]}: run make PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,lint]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mpconvert sample_models/digits_mlp --policy mixed_float16 \
		--data sample_models/data/digits.npz --out demo_out/digits_mlp_mixed_float16 --force

# One test process per core (at most 4: each holds a TensorFlow runtime and a model or two).
PYTEST := $(BIN)/python -m pytest -q -n auto --maxprocesses 4

test: $(STAMP)
	$(PYTEST)

# ruff: the lint rules and the formatter, configured in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Also the slow end-to-end cases (every keras.applications model under both policies).
test-full: $(STAMP)
	$(PYTEST) --full

bench: $(STAMP)
	@for script in bench/*.py; do [ -e "$$script" ] || continue; $(BIN)/python "$$script" || exit 1; done

# Rebuild the committed sample models and data (deterministic; needs scikit-learn).
samples: $(STAMP)
	$(BIN)/pip install --quiet -e '.[build-samples]'
	$(BIN)/python sample_models/build.py

clean:
	rm -rf demo_out .pytest_cache

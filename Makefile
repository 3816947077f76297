# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-full lint bench samples clean docs install-check

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

# One test process per core (at most 4: each holds a TensorFlow runtime and a model or two);
# a test file's tests in one process, so that its module fixtures (a conversion, a
# batch, a server) are built once, not once in each process.
PYTEST := $(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

test: $(STAMP)
	$(PYTEST)

# ruff: the lint rules and the formatter; lint-imports: the layer contracts;
# mypy: the types of mpconvert/ (all configured in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# A non-editable install (the wheel pip builds from this tree, as `pip install .`
# gets it) converts a sample model, run from outside the source tree so that
# only the installed files are used: package data (the report schemas) and
# the console script included. The wheel goes into its own folder on
# PYTHONPATH; its dependencies are the environment's.
WHEEL_DIR := build/install-check
install-check: $(STAMP)
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	$(BIN)/pip wheel --quiet --no-deps --no-build-isolation -w $(WHEEL_DIR) .
	$(BIN)/pip install --quiet --no-deps --target $(WHEEL_DIR)/site $(WHEEL_DIR)/mpconvert-*.whl
	cd $(WHEEL_DIR) && PYTHONPATH=$(CURDIR)/$(WHEEL_DIR)/site $(CURDIR)/$(BIN)/python -c \
		'import mpconvert, sys; assert mpconvert.__file__.startswith("$(CURDIR)/$(WHEEL_DIR)/site/"), mpconvert.__file__'
	cd $(WHEEL_DIR) && PYTHONPATH=$(CURDIR)/$(WHEEL_DIR)/site $(CURDIR)/$(WHEEL_DIR)/site/bin/mpconvert \
		$(CURDIR)/sample_models/cancer_mlp.keras --policy mixed_bfloat16 --data $(CURDIR)/sample_models/data/breast_cancer.npz \
		--out converted --json --quiet > report.json
	PYTHONPATH=$(CURDIR)/$(WHEEL_DIR)/site $(BIN)/python -c 'import json, sys; from mpconvert.report.schema import problems; \
		r = json.load(open("$(WHEEL_DIR)/report.json")); p = problems(r, "report"); \
		sys.exit("\n".join(p)) if p else print("install-check: the installed wheel converted cancer_mlp, passed:", r["passed"])'

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
	rm -rf demo_out .pytest_cache build

# Regenerate docs/options.md from the options' declarations (a test checks it is current).
docs: $(STAMP)
	$(BIN)/python -m mpconvert.render.options_doc > docs/options.md

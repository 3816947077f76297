# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-full bench samples clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mpconvert sample_models/digits_mlp --policy mixed_float16 \
		--data sample_models/data/digits.npz --out demo_out/digits_mlp_mixed_float16 --force

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Also the slow end-to-end cases (every keras.applications model under both policies).
test-full: $(STAMP)
	$(BIN)/python -m pytest -q --full

bench: $(STAMP)
	@for script in bench/*.py; do [ -e "$$script" ] || continue; $(BIN)/python "$$script" || exit 1; done

# Rebuild the committed sample models and data (deterministic; needs scikit-learn).
samples: $(STAMP)
	$(BIN)/pip install --quiet -e '.[build-samples]'
	$(BIN)/python sample_models/build.py

clean:
	rm -rf demo_out .pytest_cache

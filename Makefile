# Hydra Lab: `make run` starts the app, `make test` runs the tests (and builds the docs);
# both set up .venv first. `make docs` builds the docs site into site/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hydra-setup
PORT   ?= 8501
# (the variable silences Material's banner about MkDocs 2, which is not a build warning)
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

.PHONY: setup run test test-unit test-e2e docs screenshots lint bench report clean-cache

setup: $(STAMP)
	@scripts/system-packages.sh data

# Re-installs only when a requirements file changed (the stamp is newer otherwise).
# The project itself is installed editable: `import hydra_core` works from any folder, and the
# console script `hydra-lab` (= python -m hydra_core) is on the venv's PATH.
$(STAMP): requirements.txt requirements-dev.txt requirements-data.txt pyproject.toml scripts/install.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	scripts/install.sh $(BIN)/python
	touch $(STAMP)

# .streamlit/config.toml: no file watcher (it watched the whole checkout, .venv included) and no
# garbage collection after every script run (it starved the pages' background jobs).
run: setup
	$(BIN)/streamlit run app.py --server.port $(PORT) --server.headless true

# The docs site, built strictly (a few seconds: a broken link or anchor fails CI), then the unit
# tests and the real-browser test (skipped, with its reason, where chromium cannot be installed).
test: setup
	$(MKDOCS) build --strict
	-@scripts/system-packages.sh browser
	$(BIN)/python -m pytest -q -rs -m "not slow" -n 2 --dist loadfile --no-loadscope-reorder

# The docs site (mkdocs.yml: the pages under docs/) into site/; any warning fails the build.
docs: setup
	$(MKDOCS) build --strict

test-unit: setup
	$(BIN)/python -m pytest -q

test-e2e: setup
	@scripts/system-packages.sh browser
	$(BIN)/python -m pytest -q -m e2e tests/e2e

# The docs' screenshots: the browser walk with larger sizes (a budget-24 search; ~10 min).
screenshots: setup
	@scripts/system-packages.sh browser
	HYDRA_E2E_N_SEARCH=256 HYDRA_E2E_N_REPORT=1000 HYDRA_E2E_BUDGET=24 HYDRA_E2E_PAGE_TIMEOUT=900 \
		$(BIN)/python -m pytest -q -m e2e tests/e2e
	cp e2e-artifacts/setup.png e2e-artifacts/headmap.png e2e-artifacts/importance.png \
		e2e-artifacts/representations.png e2e-artifacts/masks.png e2e-artifacts/hydra.png \
		e2e-artifacts/hydra-figures.png e2e-artifacts/headmap-stability.png docs/screenshots/
	cp e2e-artifacts/text-*.png e2e-artifacts/clip-*.png docs/screenshots/

lint: setup
	$(BIN)/ruff check hydra_core hydra_ui pages tests bench docs app.py

bench: setup
	$(BIN)/python bench/greedy.py
	$(BIN)/python bench/fusion.py
	$(BIN)/python bench/hydra_page.py

report: setup
	$(BIN)/python -m hydra_core report --out docs/report --overwrite

clean-cache:
	find cache -mindepth 1 ! -name .gitignore -exec rm -rf {} +

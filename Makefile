# PyTorch from the Inside: every command a student, an instructor or CI needs.
#   make lessons        install if needed, then run every lesson in course order
#   make test           install if needed, then run the whole CPU test suite
#   make lesson N=01    run one lesson
#   make exercises N=01 check your answers in lessons/01_*/exercises.py
#   make outputs N=01   rewrite lesson 01's Output blocks from what it prints now (all: no N)
#   make notebooks      regenerate every notebook from its script
#   make drift TORCH=2.14.1  run every lesson's output check on another torch (build/drift-*.md)
#   make clean-venv     remove the venv (e.g. one made by a too-old Python)
#   make readme         regenerate the README's course map from lessons/course.toml
#   make gpu-report     the GPU tests lesson by lesson, written to results/gpu/<device>.md
#   make test-gpu       the CUDA / MPS / multi-GPU tests (skipped with reasons on a CPU machine)
#   make test-portable  the documented outputs under simulated AVX2 / no-vector CPUs
#   make test-pythons   the suite on Python 3.12 and 3.13 too (venvs under build/)
#   make soak           30 consecutive 2-rank launches: the teardown must never abort
#   make soak-suite     the whole suite RUNS=10 times over .venv and PYTHONS: names every failure

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pip's progress shows on a terminal; in a log (CI, a pipe) pip stays quiet.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu: take torch's CPU-only build from PyTorch's
# own index (an extra index: PyPI still serves the rest). Untested on the course's machines.
TORCH_INDEX ?=
PIP_INSTALL = $(PY) -m pip install --disable-pip-version-check $$(test -t 1 || echo --quiet) \
	$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
	$$($(PY) scripts/deps.py dev)
# pytest-xdist: two workers on two cores; a lesson's tests stay in one worker (its script
# and notebook run once per test module).
PYTEST := $(PY) -m pytest -n 2 --dist loadfile

.PHONY: install lessons lesson test test-slow test-gpu exercises outputs notebooks readme reading drift \
	soak soak-suite clean clean-venv test-portable test-pythons

# The stamp says the venv was made; the pins are re-checked on every `make install` (and so
# before every target that needs it): another torch in the venv is reinstalled at its pin.
install: $(STAMP)
	@$(PY) scripts/deps.py --verify dev || { \
		echo "Reinstalling the pinned packages into $(VENV): this may take a few minutes"; \
		$(PIP_INSTALL) && $(PY) scripts/deps.py --verify dev; }
	@$(PY) scripts/deps.py --site

# venv + pip, not uv or poetry: `pip install torch==2.13.0` takes the CPU wheel, where the
# others would download a multi-GB CUDA build. `deps.py --site` (run by `install` every time)
# writes the venv's course-root.pth: the repository root on the venv's path, so that
# `scripts` imports from anywhere (pytest's plugin, the notebook tools), and scripts/quiet.py
# run at start-up, which keeps PyTorch's diagnostic lines (libkineto's `USDT: profiler_start`,
# the CUDA build's no-GPU lines) out of every lesson run. Python < 3.11 is refused before
# anything is created.
$(STAMP): pyproject.toml scripts/deps.py
	@$(PYTHON) scripts/deps.py --check-python $(VENV)
	@$(PYTHON) -m venv $(VENV)
	@$(PY) scripts/deps.py --announce $(VENV) dev
	@$(PIP_INSTALL)
	@$(PY) scripts/deps.py --site
	@touch $(STAMP)
	@echo "Installed: $(VENV) holds the course's pinned packages."

lessons: install
	$(PY) -m scripts.run_lessons

lesson: install
	@$(PY) -m scripts.run_lessons --show "$(N)"

# PYTEST_MARKERS: which tests `make test` runs (the CI workflow leaves out "mps" on hosted
# macOS runners, which report MPS but fail on it).
PYTEST_MARKERS ?= not slow
test: install
	$(PYTEST) -m "$(PYTEST_MARKERS)"

test-slow: install
	$(PYTEST) -m slow

test-gpu: install
	$(PY) -m pytest -m "cuda or mps or multigpu"

# Every cuda/multigpu test, lesson by lesson, with the figures the tests record, written to
# results/gpu/<device>.md; without a GPU, one line and nothing written. gpu-report-here runs
# under $(PYTHON) as it is, no venv: the lent GPU machine's python3 has its own torch (not the
# pin) and no notebook tools. GPU_REPORT_ARGS: e.g. --lessons 07b 08b, --dry-run.
.PHONY: gpu-report gpu-report-here
gpu-report: install
	$(PY) -m scripts.gpu_report $(GPU_REPORT_ARGS)

gpu-report-here:
	$(PYTHON) -m scripts.gpu_report $(GPU_REPORT_ARGS)

exercises: install
	@$(PY) -m scripts.exercises "$(N)"

outputs: install
	$(PY) -m scripts.outputs $(N)

notebooks: install
	$(PY) -m scripts.notebooks

readme: install
	$(PY) -m scripts.readme

# lessons/READING.md from every lesson's Read the source cell (scripts/reading.py).
reading: install
	$(PY) -m scripts.reading

# A separate venv under build/ with the candidate torch; the course's venv is not touched.
drift: install
	$(PY) -m scripts.drift $(TORCH)

# The portability gate: every lesson's documented outputs under simulated other CPUs (AVX2,
# no vector ISA), each with a fresh Inductor cache. `.ci/run` runs it after `make test`.
test-portable: install
	$(PY) -m scripts.portable

# The suite on other Pythons, each in its own venv under build/ (on a machine without a CPU
# wheel for them, pip takes torch's CUDA build: ~5 GB and a few minutes each).
PYTHONS ?= $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3 $(HOME)/.pyenv/versions/3.13.*/bin/python3)
test-pythons:
	@test -n "$(PYTHONS)" || { echo "no other Python found: make test-pythons PYTHONS='/path/to/python3.12 ...'"; exit 2; }
	@set -e; for py in $(PYTHONS); do \
		v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
		echo "== Python $$v ($$py): make test VENV=build/venv-$$v"; \
		$(MAKE) --no-print-directory test PYTHON=$$py VENV=build/venv-$$v; \
	done

soak: install
	$(PY) -m scripts.soak --runs 30

# The whole `make test` suite RUNS times, round-robin over .venv and one venv per PYTHONS
# (as test-pythons makes them); prints every test that failed even once (build/soak-suite/).
RUNS ?= 10
PY_VERSION = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
soak-suite: install
	@$(foreach py,$(PYTHONS),$(MAKE) --no-print-directory install PYTHON=$(py) VENV=build/venv-$(call PY_VERSION,$(py)) &&) true
	$(PY) -m scripts.soak_suite --runs $(RUNS) --markers "$(PYTEST_MARKERS)" --venv $(VENV) \
		$(foreach py,$(PYTHONS),--venv build/venv-$(call PY_VERSION,$(py)))

clean:
	rm -rf build .pytest_cache

clean-venv:
	rm -rf $(VENV)

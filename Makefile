# PyTorch from the Inside: every command a student, an instructor or CI needs.
#   make lessons        install if needed, then run every lesson in course order
#   make test           install if needed, then run the whole CPU test suite
#   make lesson N=01    run one lesson
#   make exercises N=01 check your answers in lessons/01_*/exercises.py
#   make notebooks      regenerate every notebook from its script
#   make readme         regenerate the README's course map from lessons/course.toml
#   make test-gpu       the CUDA / MPS / multi-GPU tests (skipped with reasons on a CPU machine)
#   make soak           30 consecutive 2-rank launches: the teardown must never abort

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pytest-xdist: two workers on two cores; a lesson's tests stay in one worker (its script
# and notebook run once per test module).
PYTEST := $(PY) -m pytest -n 2 --dist loadfile

.PHONY: install lessons lesson test test-slow test-gpu exercises notebooks readme soak clean

install: $(STAMP)

# venv + pip, not uv or poetry: `pip install torch==2.13.0` takes the CPU wheel, where the
# others would download a multi-GB CUDA build. The .pth file puts the repository root on the
# venv's path so that `scripts` imports from anywhere (pytest's plugin, the notebook tools).
$(STAMP): pyproject.toml scripts/deps.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $$($(PYTHON) scripts/deps.py dev)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" | \
		xargs -I{} sh -c 'echo "$(CURDIR)" > "{}/course-root.pth"'
	touch $(STAMP)

lessons: install
	$(PY) -m scripts.run_lessons

lesson: install
	$(PY) -m scripts.run_lessons --show $(N)

test: install
	$(PYTEST) -m "not slow"

test-slow: install
	$(PYTEST) -m slow

test-gpu: install
	$(PY) -m pytest -m "cuda or mps or multigpu"

exercises: install
	$(PY) -m scripts.exercises $(N)

notebooks: install
	$(PY) -m scripts.notebooks

readme: install
	$(PY) -m scripts.readme

soak: install
	$(PY) -m scripts.soak --runs 30

clean:
	rm -rf build .pytest_cache

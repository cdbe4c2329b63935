# Scaling ML Labs. `make run` renders every notebook; `make test` is what CI runs.
# Both create .venv and fetch the data on first use, and are safe to repeat.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# pip's own output goes here, not to the terminal: a site's pip configuration can make it print
# many harmless warnings, which would bury the lesson's output. On failure its tail is shown.
PIPLOG := $(VENV)/pip-install.log
# Seconds a single notebook cell may take before nbval / nbconvert give up on it.
CELL_TIMEOUT ?= 900

.PHONY: help venv doctor data run test unit handout release grade grade-merge grade-export collect index gpu clean

help:
	@echo "make doctor   set up (first time), then check this machine against what each lesson needs"
	@echo "make run      set up (first time), then execute every notebook in full mode into build/"
	@echo "make test     set up (first time), every test, then every notebook in quick mode (nbval)"
	@echo "make unit     the fast tests only (no clusters, kernels or nbgrader): a few minutes"
	@echo "make release  the nbgrader course in build/course/: source/ and release/ (student copies)"
	@echo "make grade SUBMISSIONS=dir  autograde one sub-folder per student into build/course/grades.csv"
	@echo "           [JOBS=n] [STUDENTS=a,b] [REGRADE=1] [SHARD=i/m] [SANDBOX=0] [MEMORY_MB=n]"
	@echo "make collect FROM=download.zip ROSTER=roster.csv  Canvas's or Moodle's submission zip into"
	@echo "           one folder per student [INTO=build/submissions], what make grade reads"
	@echo "make grade-merge  merge the SHARD=i/m gradings into one gradebook, grades.csv, feedback"
	@echo "make grade-export FORMAT=canvas|moodle|csv ROSTER=roster.csv  the gradebook's points per"
	@echo "           notebook as the LMS's import file [COLUMNS_CSV=columns.csv] [OUT=file]"
	@echo "make handout  the release's student copies, flat in build/handout/ (self-study)"
	@echo "make index    regenerate the table of contents in notebooks/00_index.ipynb"
	@echo "make gpu      replace the CPU TensorFlow wheel with the CUDA build (Linux + NVIDIA)"
	@echo "make clean    remove build/ and runs/ (keeps .venv and the data cache)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is needed, $(PYTHON) is " + sys.version.split()[0] + ": run make PYTHON=python3.11 (or newer)")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing packages into $(VENV) (pip's log: $(PIPLOG)) ..."
	@$(PY) -m pip install --upgrade pip > $(PIPLOG) 2>&1 \
	  && $(PY) -m pip install -e . >> $(PIPLOG) 2>&1 \
	  || { tail -n 40 $(PIPLOG) >&2; echo "make venv: pip failed, the whole log is in $(PIPLOG)" >&2; exit 1; }
	touch $@

# Python, packages, GPU, cores, memory and disk against each lesson's measured needs, network
# namespaces, loopback ports: one line each, ok / warn / FAIL with what to do. Seconds.
doctor: $(STAMP)
	$(PY) -m helpers.doctor

data: $(STAMP)
	$(PY) -m tools.fetch_data

run: data
	$(PY) -m tools.run_notebooks --timeout $(CELL_TIMEOUT) --record-times

# The fast tests (a few minutes); the slow ones (clusters, kernels, nbgrader) and the
# notebooks run in `make test`.
unit: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow" tests

# Tests run in TEST_JOBS pytest-xdist workers, a file at a time each (--dist loadfile: a
# notebook's cells and a file's shared fixtures stay in one process), longest files first
# (conftest.py's LONGEST_FIRST; --no-loadscope-reorder keeps that order). Many slow tests
# mostly wait (clusters, timeouts, kernels), so two workers on two cores fill the gaps.
TEST_JOBS ?= 2
XDIST = -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder

# pytest exits 5 when it collected nothing: that is a failure here, and says so.
# The notebooks tests/test_executed_copies.py runs through the runner (and reads in a browser):
# nbval leaves them out, so each notebook runs once.
RUNNER_CHECKED = 01_doc2vec_dbpedia 02_logreg_lr_schedules 05_parameter_server

# Tests that measure this machine against a model of it (the simulator's predictions of real
# runs) run after the others, with the cores to themselves: beside the other worker's kernels
# and clusters, the load moves between a calibration run and the runs it predicts.
ALONE = tests/test_sim_validation.py

test: data
	LABS_QUICK=1 $(PY) -m pytest $(XDIST) tests notebooks $(RUNNER_CHECKED:%=--ignore=notebooks/%.ipynb) \
	  $(ALONE:%=--ignore=%) --nbval-lax --nbval-current-env --nbval-cell-timeout=$(CELL_TIMEOUT); \
	  status=$$?; [ $$status -ne 5 ] || echo "make test: pytest collected no tests" >&2; \
	  LABS_QUICK=1 $(PY) -m pytest $(ALONE); alone=$$?; \
	  [ $$alone -ne 5 ] || echo "make test: pytest collected no tests in $(ALONE)" >&2; \
	  [ $$status -ne 0 ] || status=$$alone; exit $$status

# The nbgrader course (README, "Teaching with this collection"). COURSE is its folder.
COURSE ?= build/course

release: $(STAMP)
	$(PY) -m tools.course release --course $(COURSE) --timeout $(CELL_TIMEOUT)

# Quick mode unless FULL=1; STUDENTS=ada,bob grades only those; a notebook unchanged since it was
# graded keeps its grade unless REGRADE=1; JOBS=N notebooks at once (default: half the cores);
# each in a sandbox (SANDBOX=0: none), within MEMORY_MB; SHARD=i/m grades the i-th of m slices
# of the students into COURSE/shards/ (see grade-merge). Needs the data, as the notebooks run.
grade: data
	@test -n "$(SUBMISSIONS)" || { echo "make grade: name the submissions folder, one sub-folder per student: make grade SUBMISSIONS=path/to/submissions" >&2; exit 2; }
	$(PY) -m tools.course grade "$(SUBMISSIONS)" --course $(COURSE) --timeout $(CELL_TIMEOUT) $(if $(filter 1,$(FULL)),--full) $(if $(STUDENTS),--students "$(STUDENTS)") $(if $(filter 1,$(REGRADE)),--regrade) $(if $(JOBS),--jobs $(JOBS)) $(if $(filter 0,$(SANDBOX)),--no-sandbox) $(if $(MEMORY_MB),--memory-mb $(MEMORY_MB)) $(if $(SHARD),--shard $(SHARD))

# After every SHARD=i/m of a class was graded (on this machine or others sharing COURSE):
# one gradebook, grades.csv, feedback and report.
grade-merge: $(STAMP)
	$(PY) -m tools.course merge --course $(COURSE) --timeout $(CELL_TIMEOUT)

# An LMS's submission download (Canvas's "Download Submissions", Moodle's "Download all
# submissions": one zip per assignment) into INTO/<nbgrader id>/, through the roster that
# grade-export reads (tools/course/collect.py); run it once per zip, then make grade.
INTO ?= build/submissions
collect: $(STAMP)
	@test -n "$(FROM)" -a -n "$(ROSTER)" || { echo "make collect: name the zip and the roster: make collect FROM=submissions.zip ROSTER=roster.csv" >&2; exit 2; }
	$(PY) -m tools.course collect "$(FROM)" --roster "$(ROSTER)" --into "$(INTO)"

# The gradebook's points per student and notebook as the file an LMS's gradebook import reads
# (tools/course/lms.py says the formats): ROSTER maps nbgrader ids to the LMS's ids; COLUMNS_CSV
# (notebook,column) names each notebook's column; OUT defaults to COURSE/FORMAT.csv.
FORMAT ?= csv
grade-export: $(STAMP)
	@test -n "$(ROSTER)" || { echo "make grade-export: name the roster (nbgrader_id and the LMS's id columns): make grade-export FORMAT=$(FORMAT) ROSTER=roster.csv" >&2; exit 2; }
	@test -f "$(COURSE)/gradebook.db" || { echo "make grade-export: no gradebook in $(COURSE): grade first (make grade)" >&2; exit 2; }
	cd "$(COURSE)" && PATH="$(abspath $(VENV))/bin:$$PATH" PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" "$(abspath $(PY))" -m nbgrader export --exporter=tools.course.export.LmsExport --LmsExport.lms_format="$(FORMAT)" --LmsExport.roster="$(abspath $(ROSTER))" $(if $(COLUMNS_CSV),--LmsExport.columns="$(abspath $(COLUMNS_CSV))") --to="$(abspath $(or $(OUT),$(COURSE)/$(FORMAT).csv))"

handout: release
	rm -rf build/handout && mkdir -p build/handout
	cp $(COURSE)/release/*/*.ipynb build/handout/
	@echo "student copies (no solutions, no hidden tests, no outputs) in build/handout/"

index: $(STAMP)
	$(PY) -m tools.make_index

gpu: $(STAMP)
	$(PY) -m pip uninstall --yes tensorflow-cpu
	$(PY) -m pip install -e ".[gpu]"
	$(PY) -c 'import tensorflow as tf; print("GPUs:", tf.config.list_physical_devices("GPU"))'

clean:
	rm -rf build runs

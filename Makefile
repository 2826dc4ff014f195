# Thin wrapper: every target makes sure .venv exists and matches pyproject.toml first.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv demo demo-down test bench lint clean-venv
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml ops/bootstrap_venv.sh
	bash ops/bootstrap_venv.sh $(VENV)
	touch $@

demo: venv
	$(VENV)/bin/vlfleet demo

demo-down: venv
	$(VENV)/bin/vlfleet staging.down --name demo

test: venv
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: venv
	$(VENV)/bin/vlfleet bench

lint: venv
	$(VENV)/bin/ruff check ops service tests
	$(VENV)/bin/ansible-lint --profile production roles ops/playbooks

clean-venv:
	rm -rf $(VENV)

# Developer shortcuts; CI runs .ci/run (the same test command as the README).
PY ?= python3

.PHONY: dev lint test rules check-readme demo
dev:
	$(PY) -m pip install -e '.[test]' torch==2.13.0
lint:
	ruff check .
	$(PY) -m mypy
test:
	$(PY) -m pytest
rules:
	$(PY) -m metax_audit.report.rules_doc > docs/rules.md
check-readme:
	head -4 README.md
demo:
	metax-audit demo

PY ?= .venv/bin/python

.PHONY: proto

# Regenerate streamingnode/v1/ from proto/streamingnode/v1/*.proto (commit the result).
proto:
	$(PY) proto/generate.py

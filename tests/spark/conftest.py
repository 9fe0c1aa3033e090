"""The ``spark`` fixture (one local SparkSession per run) is in tests/conftest.py: the flusher crash
test shares it."""

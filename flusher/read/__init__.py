"""As-of readers of the flushed tables: Spark, pyarrow and DuckDB."""

"""The data pipeline: aspects computed on Spark in coordinated batches (see docs/pipeline.md)."""

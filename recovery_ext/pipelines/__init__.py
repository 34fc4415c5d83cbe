"""The two real pipelines: ontology extraction (seeds 000/002) and OCR (seed 003)."""

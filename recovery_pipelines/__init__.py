"""The two real pipelines: ontology extraction and OCR, built only on the public API of recovery_ext."""

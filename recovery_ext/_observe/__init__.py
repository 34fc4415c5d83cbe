"""Observability: the Prometheus exporter, the pipeline report (read-only views of the store) and the
OpenTelemetry spans and metrics of provider calls."""

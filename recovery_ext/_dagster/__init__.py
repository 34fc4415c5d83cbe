"""The Dagster layer: resources, the run-level executor wrapper, recoverable ops and assets, sensors.

Only this package imports ``dagster``. Its public names are exported by ``recovery_ext``.
"""

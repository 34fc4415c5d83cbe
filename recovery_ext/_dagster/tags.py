"""Dagster run and op tags recovery-ext reads and writes."""

TAG_PIPELINE = "recovery/pipeline_id"
TAG_RESUMED_FROM = "recovery/resumed_from"
TAG_RESUME_NUMBER = "recovery/resume_number"
TAG_NODE = "recovery/node"
TAG_OPTIONAL = "recovery/optional"
# On a run another run took over: which run, and why (the resume's own tags point back).
TAG_SUPERSEDED_BY = "recovery/superseded_by"
TAG_SUPERSEDED_CAUSE = "recovery/superseded_cause"

# Dagster's own tags on re-executions and run retries.
TAG_PARENT_RUN = "dagster/parent_run_id"
TAG_ROOT_RUN = "dagster/root_run_id"
TAG_WILL_RETRY = "dagster/will_retry"
TAG_RETRY_NUMBER = "dagster/retry_number"
# Set to 0 on a run recovery superseded before it is marked failed: its pipeline already continues in
# a resume run, so a Dagster run retry of it could only fail to take the pipeline over.
TAG_MAX_RETRIES = "dagster/max_retries"
NO_DAGSTER_RETRY = {TAG_MAX_RETRIES: "0"}

# The op selection of the run a resume run continues (a sensor's RunRequest cannot select ops).
TAG_OP_SELECTION = "recovery/op_selection"

# What the run's pipeline is doing now, for the UI: `waiting` while it waits out a provider outage,
# `running` once it goes on.
TAG_STATE = "recovery/state"

# A node's item progress, for the run's page in the UI: "enrich_columns 6/12 items" (the node that reported last).
TAG_PROGRESS = "recovery/progress"

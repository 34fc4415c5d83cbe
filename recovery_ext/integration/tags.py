"""Dagster run and op tags recovery-ext reads and writes."""

TAG_PIPELINE = "recovery/pipeline_id"
TAG_RESUMED_FROM = "recovery/resumed_from"
TAG_RESUME_NUMBER = "recovery/resume_number"
TAG_NODE = "recovery/node"
TAG_OPTIONAL = "recovery/optional"

# Dagster's own tags on re-executions and run retries.
TAG_PARENT_RUN = "dagster/parent_run_id"
TAG_ROOT_RUN = "dagster/root_run_id"
TAG_WILL_RETRY = "dagster/will_retry"

# The op selection of the run a resume run continues (a sensor's RunRequest cannot select ops).
TAG_OP_SELECTION = "recovery/op_selection"

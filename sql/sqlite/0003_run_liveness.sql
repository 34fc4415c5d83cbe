-- Run-level liveness: a step finds the pipeline its run owns by the owner column.
CREATE INDEX rx_pipelines_owner ON rx_pipelines (owner) WHERE status = 'running';

-- Liveness corroborated by the process that knows: a step process records which process it is
-- (process) and which process watches it (watcher: its run worker, or its Celery worker's main
-- process). The watcher checks those processes every pulse and either vouches for the node
-- (vouched_until) or reports it dead (died_at). A node whose own heartbeat expired but which
-- is vouched for is slow, not dead. Times are epoch seconds, like every DbTime column here.
ALTER TABLE rx_nodes ADD COLUMN process TEXT;
ALTER TABLE rx_nodes ADD COLUMN watcher TEXT;
ALTER TABLE rx_nodes ADD COLUMN vouched_until REAL;
ALTER TABLE rx_nodes ADD COLUMN died_at REAL;

-- A reserved request holds its room in the budget window from its reservation until its answer
-- (answered_at) plus the window: however long it took to reach the provider, the provider's
-- window around its arrival is covered. NULL while it is in flight.
ALTER TABLE rx_rate_reservations ADD COLUMN answered_at REAL;

-- New items that keep no provider call but push the node's stall deadline (a node with stall_timeout set), in ONE
-- statement: checkpoint_new_items.sql without the ledger's CTE. That CTE's INSERT runs even when it writes no
-- row, and rx_provider_calls' two statement triggers (late rows, migration 0021) fire for it anyway: about a
-- third of this statement's server time.
-- An item that has a row already makes the primary key fail the statement (unique_violation), so it writes
-- nothing; the store then runs checkpoint_items.sql, which decides item by item.
\ir _checkpoint_fence.sql
\ir _checkpoint_items.sql
\ir _checkpoint_new_written.sql
\ir _checkpoint_tail.sql

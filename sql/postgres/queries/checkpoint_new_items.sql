-- Item checkpoints of items that have no row yet (the usual case: a node's first run over them), in ONE
-- statement: checkpoint_items.sql without its ON CONFLICT clause and its refusal, which cost the server about a
-- quarter of a 1,000-item batch. The items arrive as three JSON arrays (_checkpoint_items.sql).
-- An item that has a row already (degraded, to be redone, or completed, to be refused) makes the primary key
-- fail the statement (unique_violation), so it writes nothing; the store then runs checkpoint_items.sql, which
-- decides item by item.
-- The fence, the items, their INSERT, the ledger's calls and the end are the shared parts below
-- (_checkpoint_*.sql). Items that keep no call go by checkpoint_new_items_no_calls.sql.
\ir _checkpoint_fence.sql
\ir _checkpoint_items.sql
\ir _checkpoint_new_written.sql
\ir _checkpoint_calls.sql
\ir _checkpoint_tail.sql

-- Placeholder so this branch's migrations stay numbered without a gap: 0014 belongs to another branch.
-- Drop this file at merge (the call journal is 0015).
SELECT 1;

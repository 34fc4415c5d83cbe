-- A provider's 429 makes the whole deployment back off, not only the caller that got it: the budget
-- row keeps until when nobody sharing it may send (the database clock), and how many 429s came in a
-- row (each doubles the back-off a 429 without Retry-After asks for; a granted, answered request
-- resets it). A reservation is not granted before backoff_until.

ALTER TABLE rx_rate_budgets ADD COLUMN backoff_until TIMESTAMPTZ;
ALTER TABLE rx_rate_budgets ADD COLUMN backoff_streak INTEGER NOT NULL DEFAULT 0;

-- Why a recorded call's figures are not what the provider said: a usage the provider sent that
-- could not be read (negative, not a number, NaN, beyond any real count) is recorded as 0 tokens
-- with a note instead of failing the work it answered.

ALTER TABLE rx_provider_calls ADD COLUMN note TEXT;

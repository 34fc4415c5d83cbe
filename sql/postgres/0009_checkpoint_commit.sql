-- An item checkpoint with also= writes is sent together with its COMMIT (one round trip, issue 11:
-- cost when nothing fails). That is safe only if a superseded owner's checkpoint statement FAILS,
-- so that the COMMIT behind it finds the transaction aborted and rolls the also= writes back:
-- the statement calls this function when its fence found no row. It raises SQLSTATE RX409
-- (the store's "superseded"), which the store tells apart by its code, never its text.
-- VOLATILE (the default), so the planner never evaluates it ahead of the CASE that guards it.

CREATE FUNCTION rx_superseded(p_pipeline BIGINT, p_epoch INTEGER) RETURNS BIGINT
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'RX409',
        MESSAGE = 'pipeline ' || p_pipeline || ' is no longer owned at epoch ' || p_epoch;
END
$$;

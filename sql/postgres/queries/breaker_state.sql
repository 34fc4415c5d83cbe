-- A provider endpoint's circuit breaker before each call: its state and, on the database clock, the
-- seconds left of its cool-down and of its half-open probe. No row: never failed (closed).
SELECT state, consecutive_failures,
       EXTRACT(epoch FROM open_until - now())::float8 AS open_left,
       EXTRACT(epoch FROM probe_deadline - now())::float8 AS probe_left
FROM rx_circuit_breakers WHERE endpoint = %(endpoint)s::text

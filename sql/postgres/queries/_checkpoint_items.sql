-- A checkpoint statement's items CTE (included by checkpoint_*items.sql with \ir, after the fence).
-- items: the batch's keys, statuses and results, each bound as ONE JSON array text and zipped back into rows
--   (ROWS FROM pairs the n-th elements). A JSON array is built at C speed on the client: json.dumps of the
--   keys and of the statuses, and the results' texts (encoded once, where the op completed each item)
--   joined by commas. Binary text[] arrays cost the client about 0.2 us per element each in psycopg's
--   Python array dumper: a twentieth of a 1,000-item batch's time per item (bench.batch_bench).
--   The arrays are json, not jsonb: a jsonb value holds at most 256 MB in all, so a batch of large results
--   (OCR text) would fail whole; json is checked text (1 GB), and each result becomes jsonb on its own, as a
--   bound text[] element's did.
, items AS (
    SELECT u.item_key, u.status, u.result::jsonb AS result
    FROM ROWS FROM (json_array_elements_text(%(keys)s::json), json_array_elements_text(%(statuses)s::json),
                    json_array_elements(%(results)s::json)) AS u(item_key, status, result)
)

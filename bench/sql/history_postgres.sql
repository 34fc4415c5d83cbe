-- The history bench's seed (bench/history_bench.py): set-based inserts into the application tables.
-- Section "history" adds finished pipelines :lo..:hi (ids) with their nodes, item checkpoints, ledger rows,
-- transitions, events and queue items; section "live" adds the running pipelines (ids 1..330, once).

-- section: history
SET LOCAL statement_timeout = 0;

-- statement
INSERT INTO rx_pipelines (id, job_name, origin_run_id, params, status, owner, epoch, resume_count, max_resumes,
                          created_at, started_at, updated_at, completed_at, deployment)
SELECT g, (ARRAY['llm_job', 'ocr_job', 'items_job'])[1 + g % 3], 'hist-' || g, '{"ops": {}}'::jsonb,
       CASE WHEN g % 20 = 0 THEN 'failed' ELSE 'completed' END, 'hist-' || g, 1 + (g % 10 = 0)::int,
       (g % 10 = 0)::int, 3, t, t, t + interval '20 minutes', t + interval '20 minutes', 'default'
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g, LATERAL (SELECT now() - (2000000 - g) * interval '15 seconds') AS s(t);

-- statement
INSERT INTO rx_nodes (pipeline_id, name, position, status, optional, attempts, items_total, run_id,
                      started_at, completed_at, updated_at)
SELECT g, n.name, n.pos - 1, 'completed', false, 1, CASE WHEN n.name = 'llm' THEN 10 END, 'hist-' || g,
       t, t + interval '20 minutes', t + interval '20 minutes'
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g, unnest(ARRAY['extract', 'llm', 'write']) WITH ORDINALITY AS n(name, pos),
       LATERAL (SELECT now() - (2000000 - g) * interval '15 seconds') AS s(t);

-- statement
INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
SELECT g, 'llm', 'item-' || k, CASE WHEN k = 9 AND g % 7 = 0 THEN 'degraded' ELSE 'completed' END,
       '{"text": "an answer of a few words"}'::jsonb, 'hist-' || g, 1 + (g % 10 = 0)::int,
       now() - (2000000 - g) * interval '15 seconds' + k * interval '1 minute'
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g, generate_series(0, 9) k;

-- statement
INSERT INTO rx_provider_calls (id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model, tokens_in,
                               tokens_out, latency_seconds, outcome, cost, reached_checkpoint, recorded_at, replays)
SELECT 'call-' || g || '-' || k, g, 'llm', 'item-' || k, 'hist-' || g, 1 + (g % 10 = 0 AND k < 5)::int,
       'https://api.example.com/v1/chat', CASE WHEN g % 2 = 0 THEN 'model-a' ELSE 'model-b' END, 500 + k, 200,
       1.5, CASE WHEN k = 9 AND g % 5 = 0 THEN 'rate_limited' ELSE 'ok' END, 0.0007,
       NOT (k = 9 AND g % 5 = 0), now() - (2000000 - g) * interval '15 seconds' + k * interval '1 minute', 0
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g, generate_series(0, 9) k;

-- statement
INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
SELECT e.entity_type, g, g, e.from_status, e.to_status, e.event, e.data::jsonb,
       now() - (2000000 - g) * interval '15 seconds' + e.n * interval '2 minutes'
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g,
       (VALUES (0, 'pipeline', NULL, 'running', 'created', '{"owner": "x"}'),
               (1, 'node', 'pending', 'running', 'started', '{"epoch": 1}'),
               (2, 'node', 'running', 'completed', 'completed', '{"epoch": 1}'),
               (3, 'node', 'pending', 'running', 'started', '{"epoch": 1}'),
               (4, 'node', 'running', 'completed', 'completed', '{"epoch": 1}'),
               (5, 'node', 'pending', 'running', 'started', '{"epoch": 1}'),
               (6, 'node', 'running', 'completed', 'completed', '{"epoch": 1}'),
               (7, 'pipeline', 'running', 'completed', 'completed', '{"epoch": 1}'))
       AS e(n, entity_type, from_status, to_status, event, data);

-- statement
INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
SELECT 'pipeline', g, g, 'running', 'running', 'reclaimed', '{"cause": "heartbeat", "epoch": 2}'::jsonb,
       now() - (2000000 - g) * interval '15 seconds' + interval '5 minutes'
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g WHERE g % 10 = 0;

-- statement
INSERT INTO rx_events (kind, pipeline_id, payload, created_at)
SELECT e.kind, g, '{"node": "llm"}'::jsonb, now() - (2000000 - g) * interval '15 seconds'
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g, (VALUES ('node_completed'), ('pipeline_completed')) AS e(kind);

-- statement
INSERT INTO rx_queue_items (queue, dedupe_key, payload, status, worker, attempts, created_at, updated_at,
                            started_at, completed_at, result, holder_pipeline_id, holder_epoch)
SELECT 'ocr', 'doc-' || g, '{"doc": "x.pdf"}'::jsonb, 'completed', 'hist-' || g, 1, t, t, t, t + interval '1 minute',
       '{"pages": 3}'::jsonb, g, 1
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g, LATERAL (SELECT now() - (2000000 - g) * interval '15 seconds') AS s(t)
 WHERE g % 3 = 1;

-- statement
SELECT setval('rx_pipelines_id_seq', (SELECT max(id) FROM rx_pipelines));

-- section: live
INSERT INTO rx_pipelines (id, job_name, origin_run_id, params, status, owner, epoch, resume_count, max_resumes,
                          heartbeat_at, heartbeat_deadline, created_at, started_at, updated_at, current_node,
                          deployment)
SELECT g, (ARRAY['llm_job', 'ocr_job', 'items_job'])[1 + g % 3], 'live-' || g, '{"ops": {}}'::jsonb, 'running',
       'live-' || g, 1, 0, 3, now(),
       CASE WHEN g > 300 THEN now() - interval '3 minutes' ELSE now() + interval '1 hour' END,
       now() - interval '10 minutes', now() - interval '10 minutes', now(), 'llm', 'default'
  FROM generate_series(1, 330) g;

-- statement
INSERT INTO rx_nodes (pipeline_id, name, position, status, optional, attempts, items_total, run_id, started_at,
                      updated_at, heartbeat_at, heartbeat_deadline)
SELECT g, n.name, n.pos - 1, (ARRAY['completed', 'running', 'pending'])[n.pos], false, (n.pos < 3)::int,
       CASE WHEN n.name = 'llm' THEN 1000000 END, CASE WHEN n.pos < 3 THEN 'live-' || g END, now(), now(),
       CASE WHEN n.pos = 2 THEN now() END, CASE WHEN n.pos = 2 THEN now() + interval '1 hour' END
  FROM generate_series(1, 330) g, unnest(ARRAY['extract', 'llm', 'write']) WITH ORDINALITY AS n(name, pos);

-- statement
INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
SELECT g, 'llm', 'item-' || k, 'completed', '{"text": "an answer of a few words"}'::jsonb, 'live-' || g, 1, now()
  FROM generate_series(1, 330) g, generate_series(0, 4) k;

-- statement
INSERT INTO rx_provider_calls (id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model, tokens_in,
                               tokens_out, latency_seconds, outcome, cost, reached_checkpoint, recorded_at, replays)
SELECT 'live-call-' || g || '-' || k, g, 'llm', 'item-' || k, 'live-' || g, 1, 'https://api.example.com/v1/chat',
       'model-a', 500, 200, 1.5, 'ok', 0.0007, k < 5, now(), 0
  FROM generate_series(1, 330) g, generate_series(0, 5) k;

-- statement
INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
SELECT 'pipeline', g, g, NULL, 'running', 'created', '{"owner": "x"}'::jsonb, now() FROM generate_series(1, 330) g;

-- statement
INSERT INTO rx_queue_items (queue, dedupe_key, payload, status, worker, attempts, created_at, updated_at,
                            started_at, heartbeat_deadline, holder_pipeline_id, holder_epoch)
SELECT 'ocr', 'live-doc-' || g, '{"doc": "x.pdf"}'::jsonb, CASE WHEN g <= 20 THEN 'processing' ELSE 'ready' END,
       CASE WHEN g <= 20 THEN 'live-' || g END, (g <= 20)::int, now(), now(), CASE WHEN g <= 20 THEN now() END,
       CASE WHEN g <= 20 THEN now() + interval '1 hour' END, CASE WHEN g <= 20 THEN g END,
       CASE WHEN g <= 20 THEN 1 END
  FROM generate_series(1, 70) g;

-- statement
SELECT setval('rx_pipelines_id_seq', (SELECT max(id) FROM rx_pipelines));

-- section: maintain
SET statement_timeout = 0;

-- statement
VACUUM ANALYZE;

-- statement
RESET statement_timeout;

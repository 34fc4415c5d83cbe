-- The history bench's seed on SQLite (see history_postgres.sql): recursive CTEs for the series, times as
-- epoch seconds, JSON as text.

-- section: history
INSERT INTO rx_pipelines (id, job_name, origin_run_id, params, status, owner, epoch, resume_count, max_resumes,
                          created_at, started_at, updated_at, completed_at, deployment)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi),
     t(g, t) AS (SELECT g, (julianday('now') - 2440587.5) * 86400.0 - (2000000 - g) * 15.0 FROM s)
SELECT g, CASE g % 3 WHEN 0 THEN 'llm_job' WHEN 1 THEN 'ocr_job' ELSE 'items_job' END, 'hist-' || g,
       '{"ops": {}}', CASE WHEN g % 20 = 0 THEN 'failed' ELSE 'completed' END, 'hist-' || g, 1 + (g % 10 = 0),
       (g % 10 = 0), 3, t, t, t + 1200, t + 1200, 'default'
  FROM t;

-- statement
INSERT INTO rx_nodes (pipeline_id, name, position, status, optional, attempts, items_total, run_id,
                      started_at, completed_at, updated_at)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi),
     n(name, pos) AS (VALUES ('extract', 0), ('llm', 1), ('write', 2))
SELECT g, n.name, n.pos, 'completed', 0, 1, CASE WHEN n.name = 'llm' THEN 10 END, 'hist-' || g,
       p.started_at, p.completed_at, p.completed_at
  FROM s JOIN rx_pipelines p ON p.id = s.g, n;

-- statement
INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi),
     k(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM k WHERE k < 9)
SELECT g, 'llm', 'item-' || k, CASE WHEN k = 9 AND g % 7 = 0 THEN 'degraded' ELSE 'completed' END,
       '{"text": "an answer of a few words"}', 'hist-' || g, 1 + (g % 10 = 0),
       (julianday('now') - 2440587.5) * 86400.0 - (2000000 - g) * 15.0 + k * 60
  FROM s, k;

-- statement
INSERT INTO rx_provider_calls (id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model, tokens_in,
                               tokens_out, latency_seconds, outcome, cost, reached_checkpoint, recorded_at, replays)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi),
     k(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM k WHERE k < 9)
SELECT 'call-' || g || '-' || k, g, 'llm', 'item-' || k, 'hist-' || g, 1 + (g % 10 = 0 AND k < 5),
       'https://api.example.com/v1/chat', CASE WHEN g % 2 = 0 THEN 'model-a' ELSE 'model-b' END, 500 + k, 200,
       1.5, CASE WHEN k = 9 AND g % 5 = 0 THEN 'rate_limited' ELSE 'ok' END, 0.0007,
       NOT (k = 9 AND g % 5 = 0), (julianday('now') - 2440587.5) * 86400.0 - (2000000 - g) * 15.0 + k * 60, 0
  FROM s, k;

-- statement
INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi),
     e(n, entity_type, from_status, to_status, event, data) AS (VALUES
        (0, 'pipeline', NULL, 'running', 'created', '{"owner": "x"}'),
        (1, 'node', 'pending', 'running', 'started', '{"epoch": 1}'),
        (2, 'node', 'running', 'completed', 'completed', '{"epoch": 1}'),
        (3, 'node', 'pending', 'running', 'started', '{"epoch": 1}'),
        (4, 'node', 'running', 'completed', 'completed', '{"epoch": 1}'),
        (5, 'node', 'pending', 'running', 'started', '{"epoch": 1}'),
        (6, 'node', 'running', 'completed', 'completed', '{"epoch": 1}'),
        (7, 'pipeline', 'running', 'completed', 'completed', '{"epoch": 1}'))
SELECT e.entity_type, g, g, e.from_status, e.to_status, e.event, e.data,
       (julianday('now') - 2440587.5) * 86400.0 - (2000000 - g) * 15.0 + e.n * 120
  FROM s, e;

-- statement
INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi)
SELECT 'pipeline', g, g, 'running', 'running', 'reclaimed', '{"cause": "heartbeat", "epoch": 2}',
       (julianday('now') - 2440587.5) * 86400.0 - (2000000 - g) * 15.0 + 300
  FROM s WHERE g % 10 = 0;

-- statement
INSERT INTO rx_events (kind, pipeline_id, payload, created_at)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi),
     e(kind) AS (VALUES ('node_completed'), ('pipeline_completed'))
SELECT e.kind, g, '{"node": "llm"}', (julianday('now') - 2440587.5) * 86400.0 - (2000000 - g) * 15.0
  FROM s, e;

-- statement
INSERT INTO rx_queue_items (queue, dedupe_key, payload, status, worker, attempts, created_at, updated_at,
                            started_at, completed_at, result, holder_pipeline_id, holder_epoch)
WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi),
     t(g, t) AS (SELECT g, (julianday('now') - 2440587.5) * 86400.0 - (2000000 - g) * 15.0 FROM s)
SELECT 'ocr', 'doc-' || g, '{"doc": "x.pdf"}', 'completed', 'hist-' || g, 1, t, t, t, t + 60, '{"pages": 3}', g, 1
  FROM t WHERE g % 3 = 1;

-- section: live
INSERT INTO rx_pipelines (id, job_name, origin_run_id, params, status, owner, epoch, resume_count, max_resumes,
                          heartbeat_at, heartbeat_deadline, created_at, started_at, updated_at, current_node,
                          deployment)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < 330),
     t(g, now) AS (SELECT g, (julianday('now') - 2440587.5) * 86400.0 FROM s)
SELECT g, CASE g % 3 WHEN 0 THEN 'llm_job' WHEN 1 THEN 'ocr_job' ELSE 'items_job' END, 'live-' || g,
       '{"ops": {}}', 'running', 'live-' || g, 1, 0, 3, now, CASE WHEN g > 300 THEN now - 180 ELSE now + 3600 END,
       now - 600, now - 600, now, 'llm', 'default'
  FROM t;

-- statement
INSERT INTO rx_nodes (pipeline_id, name, position, status, optional, attempts, items_total, run_id, started_at,
                      updated_at, heartbeat_at, heartbeat_deadline)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < 330),
     n(name, pos, status) AS (VALUES ('extract', 0, 'completed'), ('llm', 1, 'running'), ('write', 2, 'pending'))
SELECT g, n.name, n.pos, n.status, 0, (n.pos < 2), CASE WHEN n.name = 'llm' THEN 1000000 END,
       CASE WHEN n.pos < 2 THEN 'live-' || g END, p.started_at, p.updated_at,
       CASE WHEN n.pos = 1 THEN p.updated_at END, CASE WHEN n.pos = 1 THEN p.updated_at + 3600 END
  FROM s JOIN rx_pipelines p ON p.id = s.g, n;

-- statement
INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < 330),
     k(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM k WHERE k < 4)
SELECT g, 'llm', 'item-' || k, 'completed', '{"text": "an answer of a few words"}', 'live-' || g, 1,
       (julianday('now') - 2440587.5) * 86400.0
  FROM s, k;

-- statement
INSERT INTO rx_provider_calls (id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model, tokens_in,
                               tokens_out, latency_seconds, outcome, cost, reached_checkpoint, recorded_at, replays)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < 330),
     k(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM k WHERE k < 5)
SELECT 'live-call-' || g || '-' || k, g, 'llm', 'item-' || k, 'live-' || g, 1, 'https://api.example.com/v1/chat',
       'model-a', 500, 200, 1.5, 'ok', 0.0007, k < 5, (julianday('now') - 2440587.5) * 86400.0, 0
  FROM s, k;

-- statement
INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < 330)
SELECT 'pipeline', g, g, NULL, 'running', 'created', '{"owner": "x"}', (julianday('now') - 2440587.5) * 86400.0
  FROM s;

-- statement
INSERT INTO rx_queue_items (queue, dedupe_key, payload, status, worker, attempts, created_at, updated_at,
                            started_at, heartbeat_deadline, holder_pipeline_id, holder_epoch)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < 70),
     t(g, now) AS (SELECT g, (julianday('now') - 2440587.5) * 86400.0 FROM s)
SELECT 'ocr', 'live-doc-' || g, '{"doc": "x.pdf"}', CASE WHEN g <= 20 THEN 'processing' ELSE 'ready' END,
       CASE WHEN g <= 20 THEN 'live-' || g END, (g <= 20), now, now, CASE WHEN g <= 20 THEN now END,
       CASE WHEN g <= 20 THEN now + 3600 END, CASE WHEN g <= 20 THEN g END, CASE WHEN g <= 20 THEN 1 END
  FROM t;

-- section: maintain
ANALYZE;

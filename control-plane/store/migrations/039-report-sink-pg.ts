// 039-report-sink.ts on PostgreSQL: the same view and INSTEAD OF trigger, its body a PL/pgSQL
// function. Rows of one report that meet on one key (a cursor, an organisation's month) are summed
// first: PostgreSQL refuses an upsert that touches one row twice, where SQLite applies both.
export const pgSql = `
CREATE VIEW report_sink AS SELECT NULL::jsonb AS cursors, NULL::jsonb AS usage, NULL::jsonb AS spend, NULL::jsonb AS last_used;
CREATE FUNCTION report_sink_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO report_cursors (node_id, instance_id, last_seq, updated_at)
    SELECT v ->> 0, v ->> 1, MAX((v ->> 2)::bigint), MAX(v ->> 3) FROM jsonb_array_elements(NEW.cursors) AS v GROUP BY 1, 2
    ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = GREATEST(report_cursors.last_seq, excluded.last_seq), updated_at = excluded.updated_at;
  INSERT INTO usage_journal (project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros)
    SELECT v ->> 0, (v ->> 1)::bigint, v ->> 2, v ->> 3, v ->> 4, (v ->> 5)::bigint, (v ->> 6)::bigint, (v ->> 7)::bigint, (v ->> 8)::bigint
    FROM jsonb_array_elements(NEW.usage) WITH ORDINALITY AS e(v, n) ORDER BY n;
  INSERT INTO org_spend (org_id, month, spend_micros)
    SELECT v ->> 0, v ->> 1, SUM((v ->> 2)::bigint) FROM jsonb_array_elements(NEW.spend) AS v GROUP BY 1, 2
    ON CONFLICT (org_id, month) DO UPDATE SET spend_micros = org_spend.spend_micros + excluded.spend_micros;
  UPDATE orgs SET spend_total_micros = spend_total_micros + s.micros
    FROM (SELECT v ->> 0 AS id, SUM((v ->> 2)::bigint) AS micros FROM jsonb_array_elements(NEW.spend) AS v GROUP BY 1) AS s WHERE orgs.id = s.id;
  UPDATE api_keys SET last_used_at = l.at
    FROM (SELECT v ->> 0 AS id, MAX(v ->> 1) AS at FROM jsonb_array_elements(NEW.last_used) AS v GROUP BY 1) AS l
    WHERE api_keys.id = l.id AND api_keys.last_used_at < l.at;
  RETURN NEW;
END
$$;
CREATE TRIGGER report_sink_insert INSTEAD OF INSERT ON report_sink FOR EACH ROW EXECUTE FUNCTION report_sink_insert();
`;

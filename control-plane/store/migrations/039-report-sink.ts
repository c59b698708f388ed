// A report's writes to the state database in one statement (docs/design.md#a-report-is-one-statement).
// Inserting one row into the view report_sink runs its trigger, which moves the report
// cursors, appends the usage journal, adds spend per organisation and month and to each
// organisation's all-time spend, and moves keys' last_used_at forward: the same five writes the
// ingest used to send one by one, each from a JSON array column of the inserted row. A statement
// sent to SQLite costs a hand-off to its worker thread and back whatever it does, so a report now
// costs three (BEGIN, this insert, COMMIT) instead of seven, however many keys and organisations it
// holds. A column left NULL writes nothing.
//   cursors   [[node_id, instance_id, last_seq, updated_at], ...]  (a cursor only moves forward)
//   usage     [[project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros], ...]
//   spend     [[org_id, month, micros], ...]
//   last_used [[key_id, at], ...]                                   (never moved back)
export const sql = `
CREATE VIEW report_sink AS SELECT NULL AS cursors, NULL AS usage, NULL AS spend, NULL AS last_used;
CREATE TRIGGER report_sink_insert INSTEAD OF INSERT ON report_sink BEGIN
  INSERT INTO report_cursors (node_id, instance_id, last_seq, updated_at)
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(NEW.cursors) WHERE true
    ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq), updated_at = excluded.updated_at;
  INSERT INTO usage_journal (project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros)
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7, value ->> 8 FROM json_each(NEW.usage);
  INSERT INTO org_spend (org_id, month, spend_micros)
    SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(NEW.spend) WHERE true
    ON CONFLICT (org_id, month) DO UPDATE SET spend_micros = spend_micros + excluded.spend_micros;
  UPDATE orgs SET spend_total_micros = spend_total_micros + v.micros
    FROM (SELECT value ->> 0 AS id, SUM(value ->> 2) AS micros FROM json_each(NEW.spend) GROUP BY 1) AS v WHERE orgs.id = v.id;
  UPDATE api_keys SET last_used_at = v.at
    FROM (SELECT value ->> 0 AS id, value ->> 1 AS at FROM json_each(NEW.last_used)) AS v
    WHERE api_keys.id = v.id AND api_keys.last_used_at < v.at;
END;
`;

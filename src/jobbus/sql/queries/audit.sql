-- name: record_audit
SELECT {schema}.record_audit(%(id)s, %(actor)s, %(source)s, %(action)s, %(target)s, %(details)s::jsonb);

-- name: list_audit
-- Newest first, one page after another: the page after the entry (before_at, before_id), from `since` on.
SELECT id, at, actor, source, action, target, details
FROM {schema}.audit_log
WHERE at >= %(since)s::timestamptz
  AND (at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid)
ORDER BY at DESC, id DESC
LIMIT %(limit)s;

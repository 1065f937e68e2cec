-- Content dedupe: for schemes whose delivery id is not signed (GitHub,
-- Shopify), a resend of a stored body under a new delivery id is a duplicate.
-- The receiver sets the hash only for those schemes; the unique index holds
-- for as long as the first receipt is kept (its retention).
ALTER TABLE idem_webhook_receipts ADD COLUMN content_sha256 BLOB;
CREATE UNIQUE INDEX idem_webhook_receipts_content
    ON idem_webhook_receipts (endpoint, content_sha256)
    WHERE content_sha256 IS NOT NULL;
-- Workers claim each endpoint's due receipts separately, in id order.
DROP INDEX idem_webhook_receipts_due;
CREATE INDEX idem_webhook_receipts_due ON idem_webhook_receipts (endpoint, id)
    WHERE state IN ('received', 'failed');
-- attempts now counts every handler run, the successful one included.
UPDATE idem_webhook_receipts SET attempts = attempts + 1 WHERE state = 'processed';

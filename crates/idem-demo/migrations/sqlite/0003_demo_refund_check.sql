-- Refunds never exceed the payment, also across idempotency keys. SQLite
-- cannot add a CHECK to an existing table: the table is rebuilt with it.
CREATE TABLE demo_payments_checked (
    tenant_id       TEXT   NOT NULL,
    id              TEXT   NOT NULL,
    amount          BIGINT NOT NULL CHECK (amount > 0),
    currency        TEXT   NOT NULL,
    customer        TEXT   NOT NULL,
    reference       TEXT,
    amount_refunded BIGINT NOT NULL DEFAULT 0
                    CHECK (amount_refunded >= 0 AND amount_refunded <= amount),
    created_at_ms   BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
INSERT INTO demo_payments_checked
    SELECT tenant_id, id, amount, currency, customer, reference, amount_refunded, created_at_ms
    FROM demo_payments;
DROP TABLE demo_payments;
ALTER TABLE demo_payments_checked RENAME TO demo_payments;
CREATE UNIQUE INDEX demo_payments_reference ON demo_payments (tenant_id, reference);
CREATE INDEX demo_payments_customer ON demo_payments (tenant_id, customer, created_at_ms);

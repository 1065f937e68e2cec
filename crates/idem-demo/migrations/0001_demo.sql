CREATE TABLE demo_payments (
    tenant_id       TEXT   NOT NULL,
    id              TEXT   NOT NULL,
    amount          BIGINT NOT NULL CHECK (amount > 0),
    currency        TEXT   NOT NULL,
    customer        TEXT   NOT NULL,
    reference       TEXT,
    amount_refunded BIGINT NOT NULL DEFAULT 0,
    created_at_ms   BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE UNIQUE INDEX demo_payments_reference ON demo_payments (tenant_id, reference);
CREATE INDEX demo_payments_customer ON demo_payments (tenant_id, customer, created_at_ms);
CREATE TABLE demo_refunds (
    tenant_id     TEXT   NOT NULL,
    id            TEXT   NOT NULL,
    payment_id    TEXT   NOT NULL,
    amount        BIGINT NOT NULL CHECK (amount > 0),
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
